#!/usr/bin/env python3
"""Build the kiln-tiny pretraining corpus from text that Debian packages carry.

    python3 tools/tiny/corpus.py --cache build/tiny-cache --out build/tiny-data

Downloads the packages with `apt-get download` (no install), unpacks them with
`dpkg-deb -x`, extracts plain English text, deduplicates paragraphs, holds out
1% of documents, and writes:
    OUT/corpus/train.txt.xz, OUT/corpus/heldout.txt   (documents separated by a
                                                       line `<|endoftext|>`)
    OUT/provenance.json                               (package, version, licence,
                                                       bytes kept, skip reasons)
Only public-domain and permissively licensed sources are used; GPL/GFDL
sources are excluded by construction (they are not in SOURCES).
"""

import argparse
import codecs
import collections
import glob
import gzip
import hashlib
import json
import lzma
import os
import re
import struct
import subprocess
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rdata  # noqa: E402
import textclean as tc  # noqa: E402
import wordnet as wn  # noqa: E402

EOT = "<|endoftext|>"

# package -> (licence of the text we keep, kind)
SOURCES = {
    "r-cran-janeaustenr": ("Public domain (novels by Jane Austen); R package MIT", "austen"),
    "r-cran-tokenizers": ("Public domain (Moby-Dick, Project Gutenberg #2701; PG header/licence stripped); R package MIT", "moby"),
    "bible-kjv-text": ("Public domain (King James Version)", "kjv"),
    "sword-text-web": ("Public domain (World English Bible)", "web"),
    "dict-devil": ("Public domain (Ambrose Bierce, The Devil's Dictionary)", "dictd"),
    "dict-jargon": ("Public domain (The Jargon File 4.4.7)", "dictd"),
    "fortunes": ("BSD-3-Clause (UC Berkeley) / public domain quotations", "fortune"),
    "fortunes-min": ("BSD-3-Clause (UC Berkeley) / public domain quotations", "fortune"),
    "wordnet-base": ("WordNet 3.0 licence (BSD-like; notice in models/NOTICE-kiln-tiny.txt)", "wordnet"),
    "python3.11-doc": ("PSF-2.0 (Python documentation)", "html"),
    "sqlite3-doc": ("Public domain (SQLite documentation)", "html"),
    "postgresql-doc-15": ("PostgreSQL Licence (BSD-like)", "html"),
    "nodejs-doc": ("MIT (Node.js documentation)", "html"),
    "rust-doc": ("MIT OR Apache-2.0 (Rust books and reference)", "html"),
    "llvm-15-doc": ("Apache-2.0 WITH LLVM-exception", "html"),
    "cmake-doc": ("BSD-3-Clause (CMake documentation)", "html"),
    "golang-1.19-doc": ("BSD-3-Clause (Go documentation)", "html"),
    "sphinx-doc": ("BSD-2-Clause (Sphinx documentation)", "html"),
    "python-flask-doc": ("BSD-3-Clause (Flask documentation)", "html"),
    "python-sqlalchemy-doc": ("MIT (SQLAlchemy documentation)", "html"),
    "python-django-doc": ("BSD-3-Clause (Django documentation)", "html"),
}
EXTRA_PACKAGES = ["bible-kjv", "bsdgames"]  # reader program for the KJV; quiz files for instruct.py

# fortune files left out: offensive/stereotyping topics, ASCII art, code, non-English
FORTUNE_DROP = {"ethnic", "men-women", "ascii-art", "art", "translate-me", "perl", "linuxcookie",
                "debian", "knghtbrd", "zippy", "drugs", "sex", "off"}
# Slurs and obscenities that drop a fortune or paragraph. rot13 so the repository does not spell them.
_BLOCK_ROT13 = ["avttre", "avttref", "avttn", "snttbg", "snt", "snttbgf", "xvxr", "xvxrf", "fcvp",
                "fcvpf", "puvax", "puvaxf", "jrgonpx", "qlxr", "qlxrf", "genaal", "er gneq", "ergneq",
                "ergneqrq", "pbba", "tbbx", "pbbaf", "lvq", "frk", "shpx", "shpxvat", "phag", "juber",
                "fyhg", "envcr", "encr", "encrq", "tnl", "ubzb", "dhrre", "oybjwbo", "cravf", "intvan",
                "betnfz", "zbyrfg"]
BLOCKLIST = [codecs.decode(w, "rot13").lower() for w in _BLOCK_ROT13]
# Unambiguous slurs and obscenities: a paragraph of a dictionary, WordNet or documentation source
# that holds one is dropped (the narrative sources are kept as written).
_STRONG_ROT13 = ["avttre", "avttref", "avttn", "avttnf", "snttbg", "snttbgf", "xvxr", "xvxrf", "jrgonpx", "jrgonpxf", "phag", "phagf", "shpx", "shpxrq", "shpxre", "shpxvat", "shpxf", "zbgureshpxre", "fuvg", "fuvggl", "ohyyfuvg"]
STRONG_BLOCKLIST = [codecs.decode(w, "rot13") for w in _STRONG_ROT13]
NARRATIVE_KINDS = {"austen", "moby", "kjv", "web"}

RUST_KEEP = ("book", "reference", "nomicon", "rust-by-example", "edition-guide", "embedded-book",
             "rustc", "rustdoc", "unstable-book", "cargo")
HTML_SKIP_RE = re.compile(r"(/_static/|/_sources/|/_modules/|/_images/|/_downloads/|genindex|"
                          r"/search\.html|modindex|/whatsnew/|changelog|/releases?/|/release-notes|"
                          r"/copyright|/license|/bugs\.html|/about\.html|/404\.html)", re.I)


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, **kw)


def fetch(pkgs, cache):
    """apt-get download + dpkg-deb -x each package into cache/x/<pkg>; -> {pkg: version}."""
    debs = os.path.join(cache, "debs")
    os.makedirs(debs, exist_ok=True)
    missing = [p for p in pkgs if not glob.glob(os.path.join(debs, p + "_*.deb"))]
    if missing:
        subprocess.run(["apt-get", "download"] + missing, cwd=debs, check=True)
    versions = {}
    for p in pkgs:
        deb = sorted(glob.glob(os.path.join(debs, p + "_*.deb")))[-1]
        versions[p] = sh(["dpkg-deb", "-f", deb, "Version"]).stdout.decode().strip()
        dest = os.path.join(cache, "x", p)
        if not os.path.isdir(dest):
            os.makedirs(dest)
            sh(["dpkg-deb", "-x", deb, dest])
    return versions


# ---------------------------------------------------------------- readers
# Each reader yields (doc_id, [paragraphs]).

def read_austen(root):
    db = rdata.read_lazyload_db(glob.glob(root + "/usr/lib/R/site-library/janeaustenr/data/Rdata.rdx")[0])
    titles = {"sensesensibility": "Sense and Sensibility", "prideprejudice": "Pride and Prejudice",
              "mansfieldpark": "Mansfield Park", "emma": "Emma", "northangerabbey": "Northanger Abbey",
              "persuasion": "Persuasion"}
    for key, title in titles.items():
        lines = [x or "" for x in db[key].value]
        paras = tc.reflow(lines)
        yield from _split_chapters(f"austen/{key}", paras, re.compile(r"^(CHAPTER|Chapter)\s+[0-9IVXLC]+\.?$"))


def _split_chapters(prefix, paras, heading_re):
    cur, n = [], 0
    for p in paras:
        if heading_re.match(p) and cur:
            yield f"{prefix}/{n}", cur
            cur, n = [], n + 1
        cur.append(p)
    if cur:
        yield f"{prefix}/{n}", cur


def read_moby(root):
    db = rdata.read_lazyload_db(glob.glob(root + "/usr/lib/R/site-library/tokenizers/data/Rdata.rdx")[0])
    text = db["mobydick"].value[0].replace("\r\n", "\n").lstrip("\ufeff")
    start = text.find("*** START OF")
    end = text.find("*** END OF")
    if start < 0 or end < 0:
        raise RuntimeError("Moby-Dick: Project Gutenberg markers not found")
    text = text[text.find("\n", start) + 1:end]
    text = text[text.find("MOBY DICK; OR THE WHALE"):]
    text = re.sub(r"(?s)Original Transcriber's Notes:.*?(?=ETYMOLOGY)", "", text)
    text = re.sub(r"(?s)End of Project Gutenberg.*", "", text)
    paras = tc.reflow(text.split("\n"))
    yield from _split_chapters("moby", paras, re.compile(r"^(CHAPTER \d+|Epilogue)"))


def read_kjv(root, bible_root):
    exe = bible_root + "/usr/bin/bible"
    out = sh([exe, "-f", "-p", root + "/usr/lib", "gen1:1-rev22:21"]).stdout.decode("latin-1")
    chapters = collections.OrderedDict()
    for line in out.split("\n"):
        m = re.match(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$", line)
        if m:
            chapters.setdefault(f"{m.group(1)}{m.group(2)}", []).append(m.group(4).strip())
        elif line.strip() and chapters:
            last = next(reversed(chapters))
            chapters[last][-1] += " " + line.strip()
    for ch, verses in chapters.items():
        yield f"kjv/{ch}", ["\n".join(verses)]


def read_sword_ztext(moddir):
    """SWORD zText module (ot/nt .bzs/.bzv/.bzz, zlib blocks) -> verse markup in order."""
    for testament in ("ot", "nt"):
        bzs = open(os.path.join(moddir, testament + ".bzs"), "rb").read()
        bzv = open(os.path.join(moddir, testament + ".bzv"), "rb").read()
        bzz = open(os.path.join(moddir, testament + ".bzz"), "rb").read()
        blocks = {}
        for i in range(len(bzv) // 10):
            b, off, size = struct.unpack_from("<IIH", bzv, i * 10)
            if not size:
                continue
            if b not in blocks:
                boff, bsize, _ = struct.unpack_from("<III", bzs, b * 12)
                blocks[b] = zlib.decompress(bzz[boff:boff + bsize])
            yield blocks[b][off:off + size].decode("utf-8", errors="replace")


def read_web(root):
    moddir = glob.glob(root + "/usr/share/sword/modules/texts/ztext/*")[0]
    doc, paras, cur, n = None, [], [], 0

    def flush_par():
        if cur:
            t = tc.normalize_ws(" ".join(cur))
            if t:
                paras.append(t)
            cur.clear()

    for markup in read_sword_ztext(moddir):
        if re.search(r'<(chapter|div)\b[^>]*\bsID=[^>]*type="book"|<chapter\b[^>]*\bsID=', markup):
            flush_par()
            if paras:
                yield f"web/{n}", list(paras)
                n += 1
                paras.clear()
        pieces = re.split(r'<div\b[^>]*type="x-p"[^>]*/>', markup)
        for k, piece in enumerate(pieces):
            if k:
                flush_par()
            t = tc.strip_osis(piece)
            if t.strip():
                cur.append(t)
    flush_par()
    if paras:
        yield f"web/{n}", paras


def dictd_entries(root):
    """(headword, body text) of every entry of the dictd database in root, in file order."""
    dz = glob.glob(root + "/usr/share/dictd/*.dict.dz")[0]
    idx = dz[:-len(".dict.dz")] + ".index"
    b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def dec(s):
        v = 0
        for c in s:
            v = v * 64 + b64.index(c)
        return v

    entries = {}
    for line in open(idx, encoding="utf-8", errors="replace"):
        f = line.rstrip("\n").split("\t")
        if len(f) < 3 or f[0].startswith("00-database") or f[0].startswith("00database"):
            continue
        entries.setdefault(dec(f[1]), (dec(f[2]), f[0]))  # offsets and lengths are in bytes
    raw = gzip.open(dz).read()
    for off in sorted(entries):
        ln, head = entries[off]
        yield head, raw[off:off + ln].decode("utf-8", errors="replace")


def read_dictd(root):
    base = os.path.basename(glob.glob(root + "/usr/share/dictd/*.dict.dz")[0]).split(".")[0]
    chunk, n = [], 0
    for _head, body in dictd_entries(root):
        paras = tc.reflow(body.split("\n"))
        if not paras:
            continue
        chunk.append("\n".join(paras))
        if len(chunk) >= 40:
            yield f"{base}/{n}", chunk
            chunk, n = [], n + 1
    if chunk:
        yield f"{base}/{n}", chunk


def read_fortunes(root, skipped):
    files = sorted(glob.glob(root + "/usr/share/games/fortunes/*"))
    for path in files:
        name = os.path.basename(path)
        if "." in name or os.path.islink(path):
            continue
        if name in FORTUNE_DROP:
            skipped.append(f"{os.path.basename(root)}:{name}")
            continue
        text = open(path, encoding="utf-8", errors="replace").read()
        chunk, n = [], 0
        for entry in tc.split_fortunes(text):
            if tc.contains_blocked(entry, BLOCKLIST):
                continue
            letters = sum(c.isalpha() for c in entry)
            if letters < 0.5 * len(entry):
                continue
            entry = re.sub(r"\n\s*\n", "\n", entry)
            entry = "\n".join(ln.rstrip() for ln in entry.split("\n"))
            chunk.append(entry.replace("\t", "    "))
            if len(chunk) >= 50:
                yield f"fortunes/{name}/{n}", chunk
                chunk, n = [], n + 1
        if chunk:
            yield f"fortunes/{name}/{n}", chunk


def read_wordnet(root):
    w = wn.WordNet(root + "/usr/share/wordnet")
    # One paragraph per lemma with its senses, in alphabetical order, 100 lemmas per document.
    lemmas = sorted({lem for lem, _ in w.lemmas() if re.fullmatch(r"[a-z][a-z '-]*", lem)
                     and lem.count(" ") < 2 and not lem.startswith(("genus ", "family ", "order "))})
    chunk, n = [], 0
    for lem in lemmas:
        lines = []
        for p in ("n", "v", "a", "r"):
            for i, s in enumerate(w.senses(lem, p)[:4]):
                line = f"{lem} ({wn.POS_NAMES[s.pos]}): {s.gloss}."
                if s.examples:
                    line += ' For example: "' + s.examples[0] + '".'
                lines.append(line)
        if lines:
            chunk.append("\n".join(lines))
        if len(chunk) >= 100:
            yield f"wordnet/{n}", chunk
            chunk, n = [], n + 1
    if chunk:
        yield f"wordnet/{n}", chunk


def html_files(pkg, root):
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in sorted(filenames):
            if fn.endswith((".html", ".htm", ".html.gz")):
                files.append(os.path.join(dirpath, fn))
    out = []
    for f in files:
        rel = f[len(root):]
        if HTML_SKIP_RE.search(rel):
            continue
        if pkg == "rust-doc":
            m = re.search(r"/html/([^/]+)/", rel)
            if not m or m.group(1) not in RUST_KEEP or "/print.html" in rel:
                continue
        if pkg == "llvm-15-doc" and "/doxygen" in rel:
            continue
        if pkg == "sqlite3-doc" and ("/c3ref/" in rel or "/session/" in rel or "/releaselog/" in rel):
            continue
        out.append(f)
    return out


def read_html(pkg, root):
    for f in html_files(pkg, root):
        raw = gzip.open(f).read() if f.endswith(".gz") else open(f, "rb").read()
        paras = [p for p in tc.html_to_paragraphs(raw.decode("utf-8", errors="replace")) if tc.is_prose(p)]
        if sum(len(p) for p in paras) < 300:
            continue
        yield pkg + ":" + f[len(root):], paras


def documents(pkg, kind, root, cache, skipped):
    if kind == "austen":
        return read_austen(root)
    if kind == "moby":
        return read_moby(root)
    if kind == "kjv":
        return read_kjv(root, os.path.join(cache, "x", "bible-kjv"))
    if kind == "web":
        return read_web(root)
    if kind == "dictd":
        return read_dictd(root)
    if kind == "fortune":
        return read_fortunes(root, skipped)
    if kind == "wordnet":
        return read_wordnet(root)
    return read_html(pkg, root)


def split_long(doc_id, paras, max_chars=12000):
    """Split long documents at paragraph boundaries so hold-out sampling is fine-grained."""
    cur, size, k = [], 0, 0
    for p in paras:
        if cur and size + len(p) > max_chars:
            yield f"{doc_id}#{k}", cur
            cur, size, k = [], 0, k + 1
        cur.append(p)
        size += len(p) + 2
    if cur:
        yield f"{doc_id}#{k}" if k else doc_id, cur


def is_heldout(doc_id, percent=1):
    return int(hashlib.sha1(doc_id.encode()).hexdigest(), 16) % 100 < percent


def dedup(docs, boilerplate_min=4):
    """docs: list of (pkg, kind, doc_id, paras). Drop repeated paragraphs.

    A paragraph whose near-dup key appears in >= boilerplate_min HTML documents is
    boilerplate and dropped everywhere; otherwise only its first occurrence is kept."""
    html_count = collections.Counter()
    for pkg, kind, _, paras in docs:
        if kind == "html":
            for k in {tc.norm_key(p) for p in paras}:
                html_count[k] += 1
    seen = set()
    out, dropped = [], collections.Counter()
    for pkg, kind, doc_id, paras in docs:
        kept = []
        for p in paras:
            k = tc.norm_key(p)
            if not k or k in seen or html_count[k] >= boilerplate_min:
                dropped[pkg] += len(p)
                continue
            seen.add(k)
            kept.append(p)
        if kept:
            out.append((pkg, kind, doc_id, kept))
    return out, dropped


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default="build/tiny-cache")
    ap.add_argument("--out", default="build/tiny-data")
    ap.add_argument("--only", nargs="*", help="restrict to these packages (debugging)")
    args = ap.parse_args()

    pkgs = [p for p in SOURCES if not args.only or p in args.only]
    versions = fetch(pkgs + EXTRA_PACKAGES, args.cache)
    docs, prov, skipped_files = [], {}, []
    for pkg in pkgs:
        lic, kind = SOURCES[pkg]
        root = os.path.join(args.cache, "x", pkg)
        n_before = len(docs)
        try:
            for doc_id, paras in documents(pkg, kind, root, args.cache, skipped_files):
                if kind not in NARRATIVE_KINDS:
                    paras = [p for p in paras if not tc.contains_blocked(p, STRONG_BLOCKLIST)]
                    if not paras:
                        continue
                for sid, sp in split_long(doc_id, paras):
                    docs.append((pkg, kind, sid, sp))
        except Exception as e:  # a hard package is skipped and reported, not fatal
            print(f"SKIP {pkg}: {e!r}", file=sys.stderr)
            prov[pkg] = {"version": versions.get(pkg), "licence": lic, "skipped": repr(e)}
            del docs[n_before:]
            continue
        raw = sum(len(p) for d in docs[n_before:] for p in d[3])
        prov[pkg] = {"version": versions[pkg], "licence": lic, "chars_extracted": raw}
        print(f"{pkg:24s} {len(docs) - n_before:7d} docs {raw / 1e6:8.2f} MB chars", file=sys.stderr)

    docs, dropped = dedup(docs)
    os.makedirs(os.path.join(args.out, "corpus"), exist_ok=True)
    train_path = os.path.join(args.out, "corpus", "train.txt.xz")
    held_path = os.path.join(args.out, "corpus", "heldout.txt")
    stats = collections.defaultdict(lambda: collections.Counter())
    with lzma.open(train_path + ".tmp", "wt", encoding="utf-8", preset=6) as tr, \
            open(held_path + ".tmp", "w", encoding="utf-8") as ho:
        for pkg, kind, doc_id, paras in docs:
            text = "\n\n".join(paras).replace(EOT, "")
            b = len(text.encode("utf-8"))
            split = "heldout" if is_heldout(doc_id) else "train"
            (ho if split == "heldout" else tr).write(text + "\n" + EOT + "\n")
            stats[pkg][split + "_bytes"] += b
            stats[pkg][split + "_docs"] += 1
    os.replace(train_path + ".tmp", train_path)
    os.replace(held_path + ".tmp", held_path)
    for pkg, st in stats.items():
        prov[pkg].update(st)
        prov[pkg]["bytes_kept"] = st["train_bytes"] + st["heldout_bytes"]
        prov[pkg]["chars_dropped_dedup"] = dropped[pkg]
    summary = {
        "packages": prov,
        "fortune_files_dropped": skipped_files,
        "excluded_by_policy": ["dict-gcide (GPL)", "dict-foldoc (GFDL)", "linux-doc (GPL)", "manpages (various/GPL)",
                               "debian-reference (GPL)", "fortunes-off (offensive)"],
        "total_bytes": sum(v.get("bytes_kept", 0) for v in prov.values()),
        "train_bytes": sum(v.get("train_bytes", 0) for v in prov.values()),
        "heldout_bytes": sum(v.get("heldout_bytes", 0) for v in prov.values()),
        "train_docs": sum(v.get("train_docs", 0) for v in prov.values()),
        "heldout_docs": sum(v.get("heldout_docs", 0) for v in prov.values()),
    }
    with open(os.path.join(args.out, "provenance.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "packages"}), file=sys.stderr)


if __name__ == "__main__":
    main()

"""Minimal reader for R serialized data (XDR format) and R lazy-load databases.

Reads what R packages ship as data (character/numeric vectors, lists, data
frames) without R installed. Only the subset of the format needed for plain
data is decoded; closures, environments and bytecode are read structurally
and returned as None-ish placeholders.
"""

import gzip
import lzma
import bz2
import struct
import zlib

NILVALUE = 254
REFSXP = 255
SPECIAL_NO_PAYLOAD = {253, 252, 251, 250, 242, 241}  # envs, unbound, missing


class RObject:
    """An R value: kind ('str', 'int', 'real', 'lgl', 'list', 'sym', ...), value, attrs."""

    def __init__(self, kind, value, attrs=None):
        self.kind = kind
        self.value = value
        self.attrs = attrs or {}

    def __repr__(self):
        return f"RObject({self.kind}, len={len(self.value) if hasattr(self.value, '__len__') else '-'})"


class RFormatError(ValueError):
    pass


class _Reader:
    def __init__(self, data):
        if data[:2] != b"X\n":
            raise RFormatError(f"unsupported R serialization header {data[:2]!r} (only XDR 'X\\n')")
        self.d = data
        self.p = 2
        self.refs = []

    def i32(self):
        if self.p + 4 > len(self.d):
            raise RFormatError("truncated R data")
        v = struct.unpack_from(">i", self.d, self.p)[0]
        self.p += 4
        return v

    def length(self):
        n = self.i32()
        if n == -1:
            hi, lo = self.i32(), self.i32()
            n = (hi << 32) + lo
        if n < 0:
            raise RFormatError("negative length")
        return n

    def header(self):
        version = self.i32()
        self.i32()  # writer version
        self.i32()  # min reader version
        if version == 3:
            n = self.i32()
            self.p += n  # native encoding name
        elif version != 2:
            raise RFormatError(f"unsupported serialization version {version}")

    def attrs_pairlist(self):
        obj = self.item()
        out = {}
        while obj is not None and isinstance(obj, RObject) and obj.kind == "pairlist":
            for tag, val in obj.value:
                out[tag] = val
            break
        return out

    def item(self):
        flags = self.i32()
        t = flags & 0xFF
        has_attr = bool(flags & (1 << 9))
        has_tag = bool(flags & (1 << 10))
        levels = flags >> 12
        if t == NILVALUE:
            return None
        if t in SPECIAL_NO_PAYLOAD:
            return RObject("special", t)
        if t == REFSXP:
            idx = flags >> 8
            if idx == 0:
                idx = self.i32()
            return self.refs[idx - 1]
        if t in (247,):  # PERSISTSXP
            self.item()
            o = RObject("persist", None)
            self.refs.append(o)
            return o
        if t == 1:  # SYMSXP
            name = self.item()
            o = RObject("sym", name)
            self.refs.append(o)
            return o
        if t in (249, 248):  # NAMESPACESXP / PACKAGESXP: persistent string vec
            self.i32()
            n = self.i32()
            vals = [self.item() for _ in range(n)]
            o = RObject("namespace", vals)
            self.refs.append(o)
            return o
        if t == 4:  # ENVSXP
            o = RObject("env", None)
            self.refs.append(o)
            self.i32()  # locked
            self.item()  # enclos
            self.item()  # frame
            self.item()  # hashtab
            self.item()  # attrib
            return o
        if t in (2, 3, 5, 6, 17, 239, 240):  # pairlist-like
            # iterate the cdr chain to avoid deep recursion on long pairlists
            cells = []
            attrs = None
            while True:
                if has_attr:
                    a = self.item()
                    if attrs is None:
                        attrs = a
                tag = self.item() if has_tag else None
                car = self.item()
                tagname = tag.value if isinstance(tag, RObject) and tag.kind == "sym" else None
                cells.append((tagname, car))
                nflags = self.i32()
                nt = nflags & 0xFF
                if nt == t and t in (2, 239):
                    flags = nflags
                    has_attr = bool(flags & (1 << 9))
                    has_tag = bool(flags & (1 << 10))
                    continue
                self.p -= 4
                self.item()  # terminating cdr (usually NILVALUE)
                break
            return RObject("pairlist", cells)
        if t == 9:  # CHARSXP
            n = self.i32()
            if n == -1:
                return None  # NA_character_
            b = self.d[self.p:self.p + n]
            if len(b) != n:
                raise RFormatError("truncated R string")
            self.p += n
            enc = "latin-1" if (levels & 4) else "utf-8"
            return b.decode(enc, errors="replace")
        if t in (10, 13):  # LGLSXP, INTSXP
            n = self.length()
            vals = list(struct.unpack_from(f">{n}i", self.d, self.p))
            self.p += 4 * n
            o = RObject("int" if t == 13 else "lgl", vals)
        elif t == 14:  # REALSXP
            n = self.length()
            vals = list(struct.unpack_from(f">{n}d", self.d, self.p))
            self.p += 8 * n
            o = RObject("real", vals)
        elif t == 15:  # CPLXSXP
            n = self.length()
            self.p += 16 * n
            o = RObject("cplx", None)
        elif t == 16:  # STRSXP
            n = self.length()
            o = RObject("str", [self.item() for _ in range(n)])
        elif t in (19, 20):  # VECSXP, EXPRSXP
            n = self.length()
            o = RObject("list", [self.item() for _ in range(n)])
        elif t == 24:  # RAWSXP
            n = self.length()
            o = RObject("raw", self.d[self.p:self.p + n])
            self.p += n
        elif t == 238:  # ALTREP: class info, state, attributes
            info = self.item()
            state = self.item()
            attr = self.item()
            o = _altrep(info, state)
            if isinstance(attr, RObject) and attr.kind == "pairlist":
                o.attrs = {k: v for k, v in attr.value}
            return o
        else:
            raise RFormatError(f"unsupported R SEXP type {t}")
        if has_attr:
            a = self.item()
            if isinstance(a, RObject) and a.kind == "pairlist":
                o.attrs = {k: v for k, v in a.value}
        return o


def _altrep(info, state):
    name = None
    if isinstance(info, RObject) and info.kind == "pairlist" and info.value:
        first = info.value[0][1]
        if isinstance(first, RObject) and first.kind == "sym":
            name = first.value
    if name in ("compact_intseq", "compact_realseq"):
        n, start, step = state.value[:3]
        vals = [start + i * step for i in range(int(n))]
        return RObject("int" if name == "compact_intseq" else "real", vals)
    if name and name.startswith("wrap_") or name == "deferred_string":
        # state is a pairlist/list whose first element is the wrapped vector
        inner = state.value[0] if isinstance(state.value, list) else state
        if isinstance(inner, tuple):
            inner = inner[1]
        return inner if isinstance(inner, RObject) else RObject("unknown", None)
    raise RFormatError(f"unsupported ALTREP class {name}")


def unserialize(data):
    """Decode one serialized R object (bytes starting with 'X\\n')."""
    r = _Reader(data)
    try:
        r.header()
        return r.item()
    except (struct.error, IndexError, RecursionError) as e:
        raise RFormatError(f"malformed R data: {e}") from e


def _decompress_any(data):
    if data[:2] == b"\x1f\x8b":
        return gzip.decompress(data)
    if data[:3] == b"BZh":
        return bz2.decompress(data)
    if data[:6] == b"\xfd7zXZ\x00":
        return lzma.decompress(data)
    return data


def read_rds(path):
    with open(path, "rb") as f:
        return unserialize(_decompress_any(f.read()))


def _lazy_blob(blob):
    """A lazy-load DB entry: 4-byte big-endian length, then zlib (or typed) data."""
    if len(blob) < 5:
        raise RFormatError("short lazy-load entry")
    kind = blob[4:5]
    if kind == b"Z":
        return lzma.decompress(blob[5:])  # type 3 uses xz under 'Z'
    if kind == b"2":
        return bz2.decompress(blob[5:])
    if kind == b"0":
        return blob[5:]
    return zlib.decompress(blob[4:])


def read_lazyload_db(rdx_path):
    """Return {name: RObject} for every variable in a lazy-load DB (.rdx + .rdb)."""
    index = read_rds(rdx_path)
    if not (isinstance(index, RObject) and index.kind == "list"):
        raise RFormatError("unexpected .rdx index structure")
    names_idx = index.attrs.get("names").value
    variables = index.value[names_idx.index("variables")]
    rdb_path = rdx_path[:-4] + ".rdb"
    with open(rdb_path, "rb") as f:
        rdb = f.read()
    out = {}
    names = variables.attrs["names"].value
    for name, pos in zip(names, variables.value):
        off, n = int(pos.value[0]), int(pos.value[1])
        out[name] = unserialize(_lazy_blob(rdb[off:off + n]))
    return out

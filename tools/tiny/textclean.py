"""Text cleaners shared by the kiln-tiny corpus and instruction builders.

Pure functions (stdlib only) so they can be unit tested without the packages.
"""

import html
import re
from html.parser import HTMLParser

# Tags whose whole content is dropped (code, navigation, chrome).
SKIP_TAGS = {"script", "style", "nav", "header", "footer", "pre", "table", "head",
             "title", "form", "button", "select", "svg", "math", "noscript", "template",
             "object", "iframe", "textarea"}
# class/id substrings that mark navigation or code containers (Sphinx, mdBook, DocBook, Doxygen).
SKIP_CLASSES = {
    "sphinxsidebar", "related", "footer", "header", "navigation", "navheader", "navfooter",
    "nav-wrapper", "nav-chapters", "menu-bar", "sidebar", "toc", "toctree-wrapper", "highlight",
    "literal-block", "doctest", "breadcrumb", "breadcrumbs", "headerlink", "copyright", "search",
    "searchbox", "admonition-title", "mobile-nav", "docs-nav", "synopsis", "programlisting",
    "screen", "funcsynopsis", "cmdsynopsis", "indextable", "genindex", "topic", "contents",
    "versionmodified", "sig", "sig-object", "prevnext", "pagination", "codeblock", "code-block",
    "sourceCode", "example-wrap", "playground", "mdbook-sidebar-scrollbox",
    "api_stability", "api_metadata", "toc-wrapper", "menu", "top-bar"}
BLOCK_TAGS = {"p", "div", "li", "ul", "ol", "dl", "dd", "dt", "h1", "h2", "h3", "h4", "h5",
              "h6", "blockquote", "section", "article", "br", "hr", "tr", "td", "th",
              "figure", "figcaption", "main", "aside", "body", "html", "caption"}
VOID_TAGS = {"br", "hr", "img", "meta", "link", "input", "area", "base", "col", "embed",
             "source", "track", "wbr", "param"}


class _Prose(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out = []
        self.skip_depth = 0
        self.stack = []  # (tag, skipping)

    def handle_starttag(self, tag, attrs):
        if tag in VOID_TAGS:
            if tag in BLOCK_TAGS and not self.skip_depth:
                self.out.append("\n\n")
            return
        toks = set(" ".join(v or "" for k, v in attrs if k in ("class", "id", "role")).split())
        skipping = tag in SKIP_TAGS or bool(toks & SKIP_CLASSES)
        self.stack.append((tag, skipping))
        if skipping:
            self.skip_depth += 1
        elif tag in BLOCK_TAGS and not self.skip_depth:
            self.out.append("\n\n")

    def handle_endtag(self, tag):
        if tag in VOID_TAGS:
            return
        # pop to the matching tag (tolerate unclosed tags)
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                for _, sk in self.stack[i:]:
                    if sk:
                        self.skip_depth -= 1
                del self.stack[i:]
                break
        if tag in BLOCK_TAGS and not self.skip_depth:
            self.out.append("\n\n")

    def handle_data(self, data):
        if not self.skip_depth:
            self.out.append(data)


def html_to_paragraphs(markup):
    """Visible prose of an HTML page as a list of whitespace-normalized paragraphs."""
    p = _Prose()
    try:
        p.feed(markup)
        p.close()
    except Exception:  # malformed HTML: keep what was parsed
        pass
    text = "".join(p.out)
    paras = []
    for block in re.split(r"\n\s*\n", text):
        block = normalize_ws(block)
        if block:
            paras.append(block)
    return paras


def normalize_ws(s):
    s = s.replace("\u00a0", " ").replace("\u200b", "").replace("\ufeff", "")
    s = s.replace("\u00b6", "")  # pilcrow anchors
    return re.sub(r"\s+", " ", s).strip()


_CODE_CHARS = set("{}()[];=<>_/\\|$#@*`~^")


def is_prose(par, min_words=6):
    """Heuristic: paragraph reads as English prose (not code, tables or navigation)."""
    words = par.split()
    if len(words) < min_words:
        return False
    n = len(par)
    letters = sum(c.isalpha() for c in par)
    if letters < 0.65 * n:
        return False
    code = sum(c in _CODE_CHARS for c in par)
    if code > 0.04 * n:
        return False
    # identifiers like foo_bar, a.b.c(), camelCase runs
    identish = sum(1 for w in words if re.search(r"[a-z][A-Z]|\w\.\w+\(|::|->|\w_\w", w))
    if identish > 0.2 * len(words):
        return False
    if not re.search(r"[.!?:;\"')]$", par):  # prose ends with punctuation
        return False
    return True


def norm_key(par):
    """Key for near-duplicate detection: lowercase letters and digits only."""
    return re.sub(r"[^a-z0-9]+", "", par.lower())


def strip_osis(markup):
    """SWORD OSIS verse markup -> plain text (drops notes and titles)."""
    s = re.sub(r"<note\b.*?</note>", " ", markup, flags=re.S)
    s = re.sub(r"<title\b.*?</title>", " ", s, flags=re.S)
    s = re.sub(r"<[^>]+>", "", s)
    return html.unescape(s)


def split_fortunes(text):
    """A fortune file (entries separated by lines holding only '%') -> entries."""
    out = []
    for chunk in re.split(r"\n%\n", "\n" + text + "\n"):
        chunk = chunk.strip("\n")
        if chunk.strip():
            out.append(chunk.rstrip())
    return out


def reflow(lines):
    """Join hard-wrapped lines into paragraphs separated by blank lines."""
    paras, cur = [], []
    for ln in lines:
        if ln.strip():
            cur.append(ln.strip())
        elif cur:
            paras.append(" ".join(cur))
            cur = []
    if cur:
        paras.append(" ".join(cur))
    return paras


def contains_blocked(text, blocklist):
    t = text.lower()
    return any(re.search(r"\b" + re.escape(w) + r"\b", t) for w in blocklist)

"""Reader for the WordNet 3.0 database files (wordnet-base: data.* and index.*).

Gives, for a lemma and part of speech, its senses in WordNet's order (most
frequent first), each with gloss, examples, synonyms, antonyms and hypernyms.
"""

import os
import re

POS_FILES = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
POS_NAMES = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}


# Senses WordNet marks as slurs or obscenities; the data tools leave them out.
OFFENSIVE_GLOSS = re.compile(r"ethnic slur|\boffensive\b|\bobscene\b|\bvulgar\b|\bdisparaging\b|"
                             r"\bderogatory\b|\bslur\b|\bdisparagingly\b|\bdysphemistic\b", re.I)


class Synset:
    __slots__ = ("offset", "pos", "words", "gloss", "examples", "pointers")

    def __init__(self, offset, pos, words, gloss, examples, pointers):
        self.offset = offset
        self.pos = pos
        self.words = words  # display forms, '_' replaced by ' '
        self.gloss = gloss
        self.examples = examples
        self.pointers = pointers  # list of (symbol, offset, pos, source/target)


def parse_data_line(line):
    """One data.* line -> Synset (None for licence header lines)."""
    if line.startswith("  "):
        return None
    body, _, gloss_part = line.partition(" | ")
    f = body.split()
    offset, pos = int(f[0]), f[2]
    w_cnt = int(f[3], 16)
    words = []
    i = 4
    for _ in range(w_cnt):
        w = f[i]
        w = re.sub(r"\((a|p|ip)\)$", "", w)  # adjective markers
        words.append(w.replace("_", " "))
        i += 2
    p_cnt = int(f[i])
    i += 1
    ptrs = []
    for _ in range(p_cnt):
        ptrs.append((f[i], int(f[i + 1]), f[i + 2], f[i + 3]))
        i += 4
    gloss_part = gloss_part.strip()
    # gloss; "example one"; "example two"
    parts = [p.strip() for p in re.split(r';\s*(?=")', gloss_part)]
    gloss = parts[0].rstrip("; ").strip()
    examples = [p.strip('"; ') for p in parts[1:] if p.startswith('"')]
    return Synset(offset, pos, words, gloss, examples, ptrs)


class WordNet:
    def __init__(self, root, drop_offensive=True):
        self.root = root
        self.synsets = {}  # (pos_file_key, offset) -> Synset
        self.index = {}  # (lemma, pos) -> [offsets] in sense order
        self.tagged = {}  # (lemma, pos) -> number of senses seen in the tagged SemCor texts
        for p, name in POS_FILES.items():
            with open(os.path.join(root, "data." + name), encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    s = parse_data_line(line)
                    if s and not (drop_offensive and (OFFENSIVE_GLOSS.search(s.gloss) or
                                                      any(OFFENSIVE_GLOSS.search(e) for e in s.examples))):
                        self.synsets[(p, s.offset)] = s
            with open(os.path.join(root, "index." + name), encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if line.startswith("  "):
                        continue
                    f = line.split()
                    lemma = f[0].replace("_", " ")
                    synset_cnt = int(f[2])
                    offs = [int(x) for x in f[-synset_cnt:] if (p, int(x)) in self.synsets]
                    if not offs:
                        continue
                    self.index[(lemma, p)] = offs
                    self.tagged[(lemma, p)] = int(f[-synset_cnt - 1])

    def senses(self, lemma, pos):
        return [self.synsets[(pos, o)] for o in self.index.get((lemma.lower(), pos), [])]

    def main_pos(self, lemma):
        """The part of speech whose senses were tagged most often (ties: n, v, a, r)."""
        best, best_n = None, -1
        for p in ("n", "v", "a", "r"):
            if (lemma, p) in self.index and self.tagged[(lemma, p)] > best_n:
                best, best_n = p, self.tagged[(lemma, p)]
        return best

    def get(self, ptr_pos, offset):
        key = "a" if ptr_pos in ("a", "s") else ptr_pos
        return self.synsets.get((key, offset))

    def related(self, syn, symbols):
        out = []
        for sym, off, pos, _ in syn.pointers:
            if sym in symbols:
                s = self.get(pos, off)
                if s:
                    out.append(s)
        return out

    def antonyms(self, syn, lemma):
        """Antonym lemmas for `lemma` in this synset (lexical pointers)."""
        out = []
        try:
            idx = [w.lower() for w in syn.words].index(lemma.lower()) + 1
        except ValueError:
            return out
        for sym, off, pos, st in syn.pointers:
            if sym != "!":
                continue
            src = int(st[:2], 16)
            tgt = int(st[2:], 16)
            if src == idx:
                s = self.get(pos, off)
                if s and tgt >= 1 and tgt <= len(s.words):
                    out.append(s.words[tgt - 1])
        return out

    def lemmas(self):
        return self.index.keys()

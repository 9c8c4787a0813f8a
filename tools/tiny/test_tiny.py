"""Unit tests for the kiln-tiny data tools (no packages or network needed).

    python3 -m unittest discover -s tools/tiny -v     (from the repository root)
"""

import json
import os
import random
import re
import struct
import sys
import tempfile
import unittest
from fractions import Fraction

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
import instruct  # noqa: E402
import rdata  # noqa: E402
import textclean as tc  # noqa: E402
import wordnet as wn  # noqa: E402


class TextCleanTest(unittest.TestCase):
    def test_html_keeps_prose_drops_code_and_nav(self):
        page = """<html><head><title>T</title><style>p{}</style></head><body>
        <div class="sphinxsidebar"><p>Navigation link text that is long enough to count.</p></div>
        <nav>Home &gt; Docs</nav>
        <h1>Title</h1><p>The quick brown fox jumps over the lazy dog, as it does every day.</p>
        <pre>for (int i = 0; i &lt; n; ++i) {}</pre>
        <div class="highlight"><span>x = 1</span></div>
        <p>Second&nbsp;paragraph with <code>inline</code> code &amp; an entity.</p></body></html>"""
        paras = tc.html_to_paragraphs(page)
        self.assertIn("The quick brown fox jumps over the lazy dog, as it does every day.", paras)
        self.assertIn("Second paragraph with inline code & an entity.", paras)
        joined = " ".join(paras)
        self.assertNotIn("Navigation", joined)
        self.assertNotIn("for (int", joined)
        self.assertNotIn("x = 1", joined)
        self.assertNotIn("Home", joined)

    def test_class_match_is_by_token(self):
        # mdBook puts 'sidebar-visible' on <body>; only the exact token 'sidebar' is navigation
        page = '<body class="sidebar-visible"><p>Real prose stays in the output, yes indeed.</p></body>'
        self.assertEqual(tc.html_to_paragraphs(page), ["Real prose stays in the output, yes indeed."])

    def test_is_prose(self):
        self.assertTrue(tc.is_prose("The function returns the number of items in the list."))
        self.assertFalse(tc.is_prose("x = foo(bar[1], {baz: 2}); return x;"))
        self.assertFalse(tc.is_prose("Next topic"))
        self.assertFalse(tc.is_prose("os.path.join() calls os.fspath() on each_arg and my_value then"))

    def test_split_fortunes_and_reflow(self):
        self.assertEqual(tc.split_fortunes("one\n%\ntwo\nlines\n%\n"), ["one", "two\nlines"])
        self.assertEqual(tc.reflow(["a b", "c", "", "", "d"]), ["a b c", "d"])

    def test_norm_key_matches_near_duplicates(self):
        self.assertEqual(tc.norm_key("Hello,  World!"), tc.norm_key("hello world"))
        self.assertNotEqual(tc.norm_key("hello world"), tc.norm_key("hello word"))

    def test_strip_osis(self):
        m = '<w lemma="x">In</w> the <note placement="foot">a note</note>beginning &amp; <title>T</title>end'
        self.assertEqual(tc.normalize_ws(tc.strip_osis(m)), "In the beginning & end")

    def test_offensive_wordnet_senses_are_dropped(self):
        self.assertTrue(wn.OFFENSIVE_GLOSS.search("(ethnic slur) offensive term for a person"))
        self.assertFalse(wn.OFFENSIVE_GLOSS.search("a narrow opening as e.g. between planks in a wall"))
        with tempfile.TemporaryDirectory() as d:
            for k, v in {"data.noun": "00000100 05 n 01 xq 0 000 | (ethnic slur) offensive term for someone\n"
                                      "00000200 05 n 01 xq 0 000 | a narrow opening\n",
                         "index.noun": "xq n 2 0 2 0 00000100 00000200  \nyq n 1 0 1 0 00000100  \n"}.items():
                with open(os.path.join(d, k), "w") as fh:
                    fh.write(v)
            for k in ("data.verb", "index.verb", "data.adj", "index.adj", "data.adv", "index.adv"):
                open(os.path.join(d, k), "w").close()
            w = wn.WordNet(d)
            self.assertEqual([s.gloss for s in w.senses("xq", "n")], ["a narrow opening"])
            self.assertEqual(w.senses("yq", "n"), [])  # only an offensive sense: the lemma is gone
            self.assertIsNone(w.main_pos("yq"))

    def test_blocklist_is_word_bounded(self):
        self.assertTrue(tc.contains_blocked("What the Heck!", ["heck"]))
        self.assertFalse(tc.contains_blocked("checked", ["heck"]))
        self.assertIn("fuck", corpus.BLOCKLIST)


def xdr_strsxp(strings):
    out = b"X\n" + struct.pack(">iii", 2, 0x040000, 0x020300)
    out += struct.pack(">ii", 16, len(strings))
    for s in strings:
        if s is None:
            out += struct.pack(">ii", 9, -1)
        else:
            b = s.encode()
            out += struct.pack(">ii", 9 | (1 << 15), len(b)) + b
    return out


class RDataTest(unittest.TestCase):
    def test_character_vector(self):
        obj = rdata.unserialize(xdr_strsxp(["It is a truth", "", None, "universally acknowledged"]))
        self.assertEqual(obj.kind, "str")
        self.assertEqual(obj.value, ["It is a truth", "", None, "universally acknowledged"])

    def test_rejects_non_xdr(self):
        with self.assertRaises(rdata.RFormatError):
            rdata.unserialize(b"A\n1\n")

    def test_truncated_is_an_error_not_a_crash(self):
        with self.assertRaises(rdata.RFormatError):
            rdata.unserialize(xdr_strsxp(["abc"])[:-6])


# Two synsets in WordNet's data file format (offsets are byte positions in the real files;
# here only their values matter).
DATA_NOUN = (
    "  1 This software and database is being provided to you, the LICENSEE\n"
    "00000100 05 n 02 dog 0 domestic_dog 0 001 @ 00000200 n 0000 | a member of the genus Canis; "
    "\"the dog barked all night\"\n"
    "00000200 05 n 01 canine 0 000 | any of various fissiped mammals\n")
INDEX_NOUN = "  1 licence\ndog n 1 1 @ 1 1 00000100  \ncanine n 1 0 1 0 00000200  \n"
DATA_ADJ = ("00000300 00 a 01 hot 0 001 ! 00000400 a 0101 | used of physical heat\n"
            "00000400 00 a 01 cold 0 001 ! 00000300 a 0101 | having a low temperature\n")
INDEX_ADJ = "hot a 1 1 ! 1 1 00000300  \ncold a 1 1 ! 1 0 00000400  \n"


def make_wordnet(d):
    files = {"data.noun": DATA_NOUN, "index.noun": INDEX_NOUN, "data.adj": DATA_ADJ, "index.adj": INDEX_ADJ,
             "data.verb": "", "index.verb": "", "data.adv": "", "index.adv": ""}
    for k, v in files.items():
        with open(os.path.join(d, k), "w") as fh:
            fh.write(v)
    return wn.WordNet(d)


class WordNetTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.w = make_wordnet(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def test_parse(self):
        s = self.w.senses("dog", "n")[0]
        self.assertEqual(s.words, ["dog", "domestic dog"])
        self.assertEqual(s.gloss, "a member of the genus Canis")
        self.assertEqual(s.examples, ["the dog barked all night"])
        self.assertEqual([h.words[0] for h in self.w.related(s, {"@"})], ["canine"])
        self.assertEqual(self.w.antonyms(self.w.senses("hot", "a")[0], "hot"), ["cold"])
        self.assertEqual(self.w.main_pos("dog"), "n")

    def test_definition_and_tool_conversations(self):
        g = instruct.Gen(self.w, ["dog"], random.Random(0))
        q, a = g.qa_define("dog", "What does {w} mean?")
        self.assertEqual(q, "What does dog mean?")
        self.assertEqual(a, "Dog is a noun meaning: a member of the genus Canis."
                         if "For example" not in a else a)
        self.assertTrue(a.startswith("Dog is a noun meaning: a member of the genus Canis."))
        c = g.tool_define("dog")
        roles = [m["role"] for m in c["messages"] if m["role"] != "system"]
        self.assertEqual(roles, ["user", "assistant", "tool", "assistant"])
        call = [m for m in c["messages"] if m.get("tool_calls")][0]["tool_calls"][0]
        self.assertEqual(call["function"], {"name": "dictionary", "arguments": {"word": "dog"}})
        tool_msg = [m for m in c["messages"] if m["role"] == "tool"][0]
        self.assertEqual(tool_msg["tool_call_id"], call["id"])
        self.assertIn("a member of the genus Canis", tool_msg["content"])
        self.assertIn("dictionary", [t["function"]["name"] for t in c["tools"]])
        json.dumps(c)  # serializable
        for _ in range(20):  # varied schemas never change the shared base schema
            g.tools_offered("dictionary")
        self.assertEqual(instruct.DICTIONARY_TOOL["function"]["description"],
                         "Look up the meaning of an English word in the dictionary.")
        self.assertIn("description", instruct.DICTIONARY_TOOL["function"]["parameters"]["properties"]["word"])
        self.assertEqual(g.qa_antonym("hot")[1], 'The opposite of hot is "cold".')
        self.assertEqual(g.qa_hypernym("dog")[1], "A dog is a kind of canine: a member of the genus Canis.")

    def test_example_pos_and_numbers(self):
        g = instruct.Gen(self.w, ["dog"], random.Random(3))
        self.assertEqual(g.qa_example("dog")[1], 'Here is an example: "The dog barked all night."')
        self.assertIsNone(g.qa_example("canine"))  # no example sentence
        self.assertEqual(g.qa_pos("hot")[1], "Hot is usually an adjective.")
        for _ in range(300):
            q, a = g.qa_number()
            nums = [int(x) for x in re.findall(r"\d+", q)]
            if q.startswith("Which"):
                self.assertTrue(a.startswith(f"{max(nums)} is larger"))
            elif q.startswith("Is") and "greater" in q:
                self.assertEqual(a.startswith("Yes"), nums[0] > nums[1])
            elif "after" in q:
                self.assertEqual(a, f"{nums[0] + 1} comes after {nums[0]}.")
            elif "before" in q:
                self.assertEqual(a, f"{nums[0] - 1} comes before {nums[0]}.")
            elif q.startswith("Count"):
                self.assertEqual(a, ", ".join(str(i) for i in range(nums[0], nums[1] + 1)) + ".")
            else:
                self.assertEqual("even" in a, nums[0] % 2 == 0)

    def test_check_conversation(self):
        g = instruct.Gen(self.w, ["dog"], random.Random(1))
        good = g.tool_define("dog")
        instruct.check_conversation(good)
        instruct.check_conversation(g.conv([{"role": "user", "content": "Hi"},
                                            {"role": "assistant", "content": "Hello!"}]))
        bad_cases = [
            {"messages": []},
            {"messages": [{"role": "user", "content": "Hi"}]},  # no answer
            {"messages": [{"role": "user", "content": "Hi"}, {"role": "bot", "content": "x"}]},
            {"messages": [{"role": "user", "content": "Hi"}, {"role": "system", "content": "late"},
                          {"role": "assistant", "content": "x"}]},
            {"messages": [m for m in good["messages"] if m["role"] != "tool" or True][:-1]},  # ends on tool
            {"messages": good["messages"]},  # tool call without tools offered
            {"messages": [m for m in good["messages"] if not m.get("tool_calls")], "tools": good["tools"]},
        ]
        for c in bad_cases:
            with self.assertRaises(ValueError):
                instruct.check_conversation(c)

    def test_calculator_conversation_is_correct(self):
        g = instruct.Gen(self.w, [], random.Random(5))
        for _ in range(200):
            c = g.tool_calc()
            call = c["messages"][-3]["tool_calls"][0]["function"]
            self.assertEqual(call["name"], "calculator")
            expr = call["arguments"]["expression"]
            self.assertEqual(c["messages"][-2]["content"], instruct.fmt_num(instruct.safe_eval(expr)))
            self.assertEqual(c["messages"][-1]["content"], f"{expr} = {c['messages'][-2]['content']}.")


class GeneratorTest(unittest.TestCase):
    def test_safe_eval(self):
        self.assertEqual(instruct.safe_eval("2 + 3 * 4"), 14)
        self.assertEqual(instruct.safe_eval("(2 + 3) * 4"), 20)
        self.assertEqual(instruct.safe_eval("7 / 2"), Fraction(7, 2))
        self.assertEqual(instruct.fmt_num(Fraction(7, 2)), "3.5")
        with self.assertRaises(ValueError):
            instruct.safe_eval("__import__('os')")

    def test_quiz_syntax(self):
        self.assertEqual(instruct.quiz_first("Andorra la V[ell|iej]a"), "Andorra la Vella")
        self.assertEqual(instruct.quiz_first("{G{eorge} }Washington"), "George Washington")
        self.assertEqual(instruct.quiz_first("Vienna|Wien"), "Vienna")
        self.assertEqual(instruct.quiz_first("forget{-| }me{-| }not"), "forget-me-not")

    def test_gloss_keywords(self):
        self.assertEqual(instruct.gloss_keywords("a male sovereign; ruler of a kingdom"), ["male", "sovereign"])
        self.assertEqual(instruct.gloss_keywords("a dwelling that serves as living quarters for one or more families"),
                         ["dwelling", "living", "quarters", "families"])

    def test_sentence_split_keeps_abbreviations(self):
        self.assertEqual(instruct.split_sentences("He came. Mr. Knightley sat. She left."),
                         ["He came.", "Mr. Knightley sat.", "She left."])


class CorpusTest(unittest.TestCase):
    def test_dedup_and_boilerplate(self):
        docs = [("p", "html", f"d{i}", ["Previous topic and next topic.", f"Unique prose number {i}."])
                for i in range(5)]
        docs.append(("q", "text", "t", ["Unique prose number 0.", "Fresh paragraph."]))
        out, dropped = corpus.dedup(docs)
        kept = [p for d in out for p in d[3]]
        self.assertNotIn("Previous topic and next topic.", kept)  # in >= 4 HTML docs: boilerplate
        self.assertEqual(kept.count("Unique prose number 0."), 1)  # exact repeat: first kept
        self.assertIn("Fresh paragraph.", kept)
        self.assertGreater(dropped["p"], 0)

    def test_holdout_is_deterministic_and_about_one_percent(self):
        ids = [f"doc/{i}" for i in range(20000)]
        held = [i for i in ids if corpus.is_heldout(i)]
        self.assertEqual(held, [i for i in ids if corpus.is_heldout(i)])
        self.assertTrue(150 < len(held) < 250, len(held))

    def test_split_long(self):
        parts = list(corpus.split_long("d", ["x" * 5000] * 5, max_chars=12000))
        self.assertEqual([p[0] for p in parts], ["d#0", "d#1", "d#2"])
        self.assertEqual(sum(len(p[1]) for p in parts), 5)


if __name__ == "__main__":
    unittest.main()

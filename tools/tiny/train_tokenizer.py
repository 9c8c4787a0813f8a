#!/usr/bin/env python3
"""Trains kiln-tiny's tokenizer: byte-level BPE with the Qwen2 pre-tokenizer (which kiln's
tokenizer importer recognises as 'qwen2': NFC, one Split regex, ByteLevel without regex).

  train_tokenizer.py --data build/tiny-data --out DIR [--vocab 8192]   (needs HF tokenizers)
  train_tokenizer.py --bytes-only --out DIR   (no merges, no HF library: for CPU smoke tests)

Writes DIR/tokenizer.json, DIR/tokenizer_config.json (chat_template = chat_template.jinja
beside this script) and, with HF tokenizers, DIR/tokenizer_ids.json: the ids HF assigns to
TEST_STRINGS (kiln's test compares its own ids with these).
"""
import argparse
import json
import lzma
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's Split regex, byte for byte (src/kiln/tokenizer/pretokenizer.cpp kQwen2).
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TEST_STRINGS = [
    "Hello, world!",
    "What does happy mean?",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and trailing   ",
    "numbers 12345 and 3.14159, -42",
    "It's John's book; they'll say we've done it.",
    "def f(x):\n    return x * 2\n",
    "Line one\n\nLine two\r\nLine three",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 Stra\u00dfe",
    "e\u0301 (combining accent, NFC)",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \u4e2d\u6587",
    "emoji \U0001F600 \U0001F680!",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<tool_call>\n{\"name\": \"dictionary\", \"arguments\": {\"word\": \"apple\"}}\n</tool_call>",
    "In the beginning God created the heaven and the earth.",
    "SELECT * FROM users WHERE id = 7;",
    "tabs\tand\tnewlines\n\n\n",
    "ALLCAPS and MiXeD CaSe words",
    "https://example.com/path?q=1&r=2",
    "<|endoftext|>",
    "",
]


def chat_template():
    with open(os.path.join(HERE, "chat_template.jinja"), encoding="utf-8") as f:
        return f.read()


def write_config(out):
    cfg = {
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 1024,
        "clean_up_tokenization_spaces": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": chat_template(),
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def bytes_only(out):
    """A valid tokenizer.json with the 256 byte tokens after the specials and no merges."""
    b2u = bytes_to_unicode()
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for b in range(256):
        vocab[b2u[b]] = len(SPECIALS) + b
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, s in enumerate(SPECIALS)],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)


def iter_texts(data, sample_bytes):
    """Corpus documents, then rendered SFT conversations (so the chat and tool-call markup
    gets merges), up to sample_bytes of corpus."""
    n = 0
    with lzma.open(os.path.join(data, "corpus", "train.txt.xz"), "rt", encoding="utf-8") as f:
        doc = []
        for line in f:
            if line.rstrip("\n") == "<|endoftext|>":
                text = "".join(doc)
                doc = []
                n += len(text)
                yield text
                if n >= sample_bytes:
                    break
            else:
                doc.append(line)
        if doc:
            yield "".join(doc)
    import jinja_render
    render = jinja_render.renderer(chat_template())
    with lzma.open(os.path.join(data, "sft", "train.jsonl.xz"), "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= 50000:
                break
            yield render(json.loads(line))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data")
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--sample-mb", type=float, default=1e9)
    ap.add_argument("--bytes-only", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    write_config(a.out)
    if a.bytes_only:
        bytes_only(a.out)
        return
    import sys
    sys.path.insert(0, HERE)
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(iter_texts(a.data, int(a.sample_mb * 1e6)), trainer)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    ids = {s: tok.encode(s).ids for s in TEST_STRINGS}
    with open(os.path.join(a.out, "tokenizer_ids.json"), "w", encoding="utf-8") as f:
        json.dump(ids, f, ensure_ascii=False, indent=0)
    print("tokenizer: vocab", tok.get_vocab_size(), "->", a.out)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes tests/fixtures/kiln_tiny/ from a training run's output folder (train.py --out):
reference.json (the PyTorch side of the logits and perplexity comparisons: fp32 compute on
the exported bf16 weights and on their Q8_0 round trip), heldout_head.txt (the start of the
held-out text the perplexity test scores), tokenizer_ids.json (HF tokenizers' ids).

  make_fixtures.py RUN_DIR REPO
"""
import json
import os
import shutil
import sys


def main():
    run, repo = sys.argv[1], sys.argv[2]
    out = os.path.join(repo, "tests", "fixtures", "kiln_tiny")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(run, "eval.json"), encoding="utf-8") as f:
        ev = json.load(f)
    ref = {"note": "written by tools/tiny/make_fixtures.py from train.py's eval.json"}
    for name in ("bf16", "q8_0"):
        small = dict(ev[name]["ppl_4chunks"])
        small.pop("running", None)
        ref[f"ppl_{name}_small"] = small
        full = dict(ev[name]["ppl_all"])
        full["running_first10"] = full.pop("running")[:10]
        ref[f"ppl_{name}_all"] = full
        ref[f"refs_{name}"] = [{"prompt": r["prompt"], "ids": r["ids"], "greedy32": r["greedy32"],
                                "last_logits": [round(x, 4) for x in r["last_logits"]]}
                               for r in ev[name]["refs"]]
    with open(os.path.join(out, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(ref, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(run, "heldout_ppl.txt"), encoding="utf-8") as f:
        text = f.read()
    # About 4x the 1024 tokens the test scores; the cut is far from them, so their
    # tokenization is unchanged (the test checks the number, which would move otherwise).
    cut = text.find("\n", 12000)
    with open(os.path.join(out, "heldout_head.txt"), "w", encoding="utf-8") as f:
        f.write(text[:cut + 1])
    shutil.copy(os.path.join(run, "tokenizer_ids.json"), os.path.join(out, "tokenizer_ids.json"))


if __name__ == "__main__":
    main()

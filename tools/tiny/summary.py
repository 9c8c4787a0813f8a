#!/usr/bin/env python3
"""Summarize build/tiny-data (sizes, counts, examples) as text, e.g. for the READY note.

    python3 tools/tiny/summary.py --out build/tiny-data > build/tiny-data/READY
"""

import argparse
import json
import os


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="build/tiny-data")
    args = ap.parse_args()
    o = args.out
    prov = json.load(open(os.path.join(o, "provenance.json")))
    sft = json.load(open(os.path.join(o, "sft", "stats.json")))
    ev = json.load(open(os.path.join(o, "eval_words.json")))
    print("kiln-tiny data: READY")
    print()
    print("Files (bytes):")
    total = 0
    for rel in ("corpus/train.txt.xz", "corpus/heldout.txt", "sft/train.jsonl.xz", "sft/heldout.jsonl",
                "eval_words.json", "provenance.json", "sft/stats.json"):
        n = os.path.getsize(os.path.join(o, rel))
        total += n
        print(f"  {rel:24s} {n:12,d}")
    print(f"  {'total':24s} {total:12,d}")
    print()
    print("Corpus: UTF-8, documents separated by a line '<|endoftext|>'.")
    print(f"  train {prov['train_bytes']:,d} bytes in {prov['train_docs']:,d} docs; "
          f"heldout {prov['heldout_bytes']:,d} bytes in {prov['heldout_docs']:,d} docs")
    print(f"  {'package':24s} {'version':28s} {'kept bytes':>12s}  licence")
    for p, v in prov["packages"].items():
        kept = v.get("bytes_kept", 0)
        print(f"  {p:24s} {str(v.get('version')):28s} {kept:12,d}  {v['licence']}"
              + (f"  SKIPPED: {v['skipped']}" if "skipped" in v else ""))
    print(f"  fortune files dropped: {', '.join(prov['fortune_files_dropped'])}")
    print()
    print("SFT (JSON Lines, one conversation per line: {messages, tools?}; tool_calls arguments are JSON objects):")
    print(f"  train {sft['train_total']:,d} conversations, heldout {sft['heldout_total']:,d} (1%, never eval words)")
    for k, n in sorted(sft["train_by_kind"].items(), key=lambda kv: -kv[1]):
        print(f"    {k:18s} {n:8,d}")
    print()
    print(f"eval_words.json: {len(ev)} words, each {{word, pos, gloss, keywords (2-4), prompt, expected_answer}};")
    k = sft["train_by_kind"]
    print(f"  their conversations ({k.get('define_eval', 0) // max(1, len(ev))} direct + "
          f"{k.get('tool_define_eval', 0) // max(1, len(ev))} tool-call phrasings each) are IN sft/train.")
    print("  " + ", ".join(e["word"] for e in ev))
    print()
    print("Examples:")
    for k in ("define_eval", "tool_define_eval", "tool_calc", "chat", "continue_verse", "capital"):
        if k in sft["examples"]:
            print(f"  [{k}] " + json.dumps(sft["examples"][k], ensure_ascii=False)[:700])


if __name__ == "__main__":
    main()

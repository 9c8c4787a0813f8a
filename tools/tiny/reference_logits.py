#!/usr/bin/env python3
"""PyTorch fp32 reference logits of an exported kiln-tiny checkpoint (train.py --out), on the
CPU: for each prompt of eval.json's refs, the last-position logits and 32 greedy tokens, for
the bf16 weights and for their Q8_0 round trip as kiln quantizes (train.q8_0_roundtrip).

  reference_logits.py RUN_DIR OUT.json [bf16,q8_0]
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train  # noqa: E402


def main():
    run, out = sys.argv[1], sys.argv[2]
    with open(os.path.join(run, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(run, "eval.json")) as f:
        ev = json.load(f)
    c = {k: cfg[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                             "num_attention_heads", "num_key_value_heads", "head_dim",
                             "max_position_embeddings", "rms_norm_eps", "rope_theta")}
    sd = train.load_safetensors_dir(run)
    res = {}
    which = sys.argv[3].split(",") if len(sys.argv) > 3 else ["bf16", "q8_0"]
    for name, q8 in (("bf16", False), ("q8_0", True)):
        if name not in which:
            continue
        m = train.Llama(c)
        m.load_state_dict({k: (train.q8_0_roundtrip(v) if q8 and v.dim() == 2 else v)
                           for k, v in sd.items()})
        m.eval()
        refs = []
        for r in ev["bf16"]["refs"]:
            with torch.no_grad():
                logits = m(torch.tensor([r["ids"]]))[0, -1]
            refs.append({"prompt": r["prompt"], "ids": r["ids"], "last_logits": logits.tolist(),
                         "greedy32": train.greedy(m, r["ids"], 32)})
        res[name] = refs
        print(name, "done", flush=True)
    with open(out, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()

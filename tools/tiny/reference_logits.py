#!/usr/bin/env python3
"""PyTorch fp32 reference logits of an exported kiln-tiny checkpoint (train.py --out), on the
CPU, for the weights after kiln's Q8_0 round trip (train.q8_0_roundtrip; add "bf16" for the
exported weights as they are): for each prompt of eval.json's refs, the last-position logits
and 32 greedy tokens. The greedy tokens recorded on the GPU machine are checked with one
teacher-forced forward (each position's argmax must be the next token); where they stop
agreeing, greedy decoding continues from there.

  reference_logits.py RUN_DIR OUT.json [q8_0[,bf16]]
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train  # noqa: E402


def main():
    run, out = sys.argv[1], sys.argv[2]
    which = sys.argv[3].split(",") if len(sys.argv) > 3 else ["q8_0"]
    with open(os.path.join(run, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(run, "eval.json")) as f:
        ev = json.load(f)
    c = {k: cfg[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                             "num_attention_heads", "num_key_value_heads", "head_dim",
                             "max_position_embeddings", "rms_norm_eps", "rope_theta")}
    sd = train.load_safetensors_dir(run)
    res = {}
    for name in which:
        q8 = name == "q8_0"
        m = train.Llama(c)
        m.load_state_dict({k: (train.q8_0_roundtrip(v) if q8 and v.dim() == 2 else v)
                           for k, v in sd.items()})
        m.eval()
        refs = []
        for r in ev[name if name in ev else "bf16"]["refs"]:
            ids, g = r["ids"], r["greedy32"]
            with torch.no_grad():
                logits = m(torch.tensor([ids + g[:-1]]))[0]
            am = logits[len(ids) - 1:].argmax(-1).tolist()
            agree = 0
            while agree < len(g) and am[agree] == g[agree]:
                agree += 1
            greedy = g[:agree]
            if agree < len(g):
                greedy = greedy + [am[agree]]
                greedy += train.greedy(m, ids + greedy, len(g) - len(greedy))
            refs.append({"prompt": r["prompt"], "ids": ids,
                         "last_logits": logits[len(ids) - 1].tolist(), "greedy32": greedy,
                         "gpu_greedy_agreed": agree})
            print(name, repr(r["prompt"][:30]), "GPU greedy tokens confirmed:", agree, flush=True)
        res[name] = refs
    with open(out, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()

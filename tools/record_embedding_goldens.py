#!/usr/bin/env python3
"""Record sentence-transformers reference embeddings for small random embedding models.

Runs on the device machine and needs nothing but torch and transformers (like
tools/record_goldens.py). sentence-transformers itself is not required: its pooling is
computed here in torch exactly as sentence_transformers.models.Pooling and Normalize do it
(sentence-transformers 3.x/4.x, models/Pooling.py):
  - lasttoken: the hidden state of the last token whose attention mask is 1
    (token_embeddings[arange(bs), mask.sum(1) - 1] for right padding; with one unpadded
    sequence per forward, as here, that is the last row),
  - mean: sum(token_embeddings * mask) / clamp(sum(mask), min=1e-9),
  - cls: token_embeddings[:, 0],
  - Normalize: torch.nn.functional.normalize(x, p=2, dim=1) (x / max(||x||_2, 1e-12)).
The token embeddings are the base model's last_hidden_state (the Transformer module's
output: after the final norm for Qwen3Model, after the last layer's output LayerNorm for
BertModel; BertModel's pooler is not used by sentence-transformers).

For each model it builds a small config, randomises every parameter (norm weights too, so a
misapplied norm cannot hide), and saves into OUT_DIR/<name>/:
  - config.json + model.safetensors, as the base model (Qwen3Model / BertModel) saves them,
    i.e. without the "model." prefix and without lm_head, like the published
    Qwen3-Embedding and BGE checkpoints,
  - modules.json and 1_Pooling/config.json in sentence-transformers' layout (the pooling
    mode the real models ship with: lasttoken for Qwen3-Embedding, cls for BGE), so a
    converter can read the pooling type the way llama.cpp's convert_hf_to_gguf.py does,
  - goldens.json: the fixed token sequences and, for each pooling mode recorded, the pooled
    vectors before normalisation ("pooled") and after ("normalized"), fp32 computed on the
    CPU, one list of `hidden_size` floats per sequence.

usage: record_embedding_goldens.py OUT_DIR [NAME ...]   (names: qwen3_embed, bert_embed)
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
import transformers

VOCAB = 256
SEQ_LENS = (1, 7, 19, 40)


def configs():
    """name -> (model class, config class, config kwargs, pooling modes, shipped mode)."""
    qwen3 = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1000000.0,
                 bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    bert = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=512, type_vocab_size=2,
                layer_norm_eps=1e-12, hidden_act="gelu", hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0, pad_token_id=0)
    return {
        "qwen3_embed": (transformers.Qwen3Model, transformers.Qwen3Config, qwen3,
                        ("lasttoken", "mean"), "lasttoken"),
        "bert_embed": (transformers.BertModel, transformers.BertConfig, bert,
                       ("mean", "cls"), "cls"),
    }


def randomise(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                if "norm" in name.lower():
                    p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
                else:  # biases
                    p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))


def pool(mode, token_embeddings, mask):
    """sentence_transformers.models.Pooling's forward for one mode; [bs, seq, h] -> [bs, h]."""
    if mode == "cls":
        return token_embeddings[:, 0]
    if mode == "mean":
        m = mask.unsqueeze(-1).expand(token_embeddings.size()).to(token_embeddings.dtype)
        s = torch.sum(token_embeddings * m, 1)
        n = torch.clamp(m.sum(1), min=1e-9)
        return s / n
    if mode == "lasttoken":
        # Pooling.py: with right padding, the last position whose mask is 1.
        last = mask.sum(1) - 1
        return token_embeddings[torch.arange(token_embeddings.shape[0]), last]
    raise ValueError(mode)


def write_st_layout(d, hidden, mode):
    """modules.json and 1_Pooling/config.json as a sentence-transformers repo ships them."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"},
    ]
    with open(os.path.join(d, "modules.json"), "w") as f:
        json.dump(modules, f, indent=1)
    os.makedirs(os.path.join(d, "1_Pooling"), exist_ok=True)
    os.makedirs(os.path.join(d, "2_Normalize"), exist_ok=True)
    pc = {"word_embedding_dimension": hidden, "pooling_mode_cls_token": mode == "cls",
          "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": False,
          "pooling_mode_mean_sqrt_len_tokens": False,
          "pooling_mode_weightedmean_tokens": False,
          "pooling_mode_lasttoken": mode == "lasttoken", "include_prompt": True}
    with open(os.path.join(d, "1_Pooling", "config.json"), "w") as f:
        json.dump(pc, f, indent=1)


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        sys.exit(2)
    out_dir = args.pop(0)
    wanted = set(args)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_num_threads(8)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__}
    for name, (model_cls, cfg_cls, kw, modes, shipped) in configs().items():
        if wanted and name not in wanted:
            continue
        try:
            cfg = cfg_cls(**kw)
            cfg._attn_implementation = "eager"
            torch.manual_seed(1234)
            model = model_cls(cfg).to(torch.float32)
            gen = torch.Generator().manual_seed(sum(map(ord, name)))
            randomise(model, gen)
            model.eval()
            d = os.path.join(out_dir, name)
            os.makedirs(d, exist_ok=True)
            model.save_pretrained(d, safe_serialization=True)
            write_st_layout(d, kw["hidden_size"], shipped)
            seqs = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in SEQ_LENS]
            pooled = {m: [] for m in modes}
            normalized = {m: [] for m in modes}
            with torch.no_grad():
                for s in seqs:  # one sequence per forward, no padding
                    ids = torch.tensor([s])
                    mask = torch.ones_like(ids)
                    extra = {"token_type_ids": torch.zeros_like(ids)} if "bert" in name else {}
                    h = model(input_ids=ids, attention_mask=mask, **extra).last_hidden_state
                    h = h.float()
                    for m in modes:
                        p = pool(m, h, mask)
                        pooled[m].append([float(x) for x in p[0].tolist()])
                        normalized[m].append([float(x) for x in F.normalize(p, p=2, dim=1)[0].tolist()])
            g = dict(name=name, model=model_cls.__name__, vocab=VOCAB,
                     hidden=kw["hidden_size"], shipped_pooling=shipped, sequences=seqs,
                     pooled=pooled, normalized=normalized, **meta)
            with open(os.path.join(d, "goldens.json"), "w") as f:
                json.dump(g, f)
            print(f"{name}: ok ({sum(p.numel() for p in model.parameters())} params)",
                  flush=True)
        except Exception as e:  # record what works; report the rest
            print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()

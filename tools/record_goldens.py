#!/usr/bin/env python3
"""Record Hugging Face transformers reference outputs for small random models.

Runs on the device machine (torch + transformers, see ../.library/device). For each
architecture it builds a small model from a config, randomises every parameter (norm weights
too, so a misapplied norm cannot hide), saves it as a Hugging Face checkpoint
(config.json + model.safetensors) and records, in fp32 on the CPU:
  - logits for every position of a few fixed token sequences (logits.f32, little-endian,
    rows in sequence order, [sum(len), vocab]),
  - the greedy continuation of 64 tokens from a fixed prompt,
into goldens.json. kiln's tests convert the checkpoint with `kiln convert` (so the fixture
exercises the same GGUF layout as downloaded files) and compare.

With --rope-probes FILE it also writes, for a set of rope configurations (yarn with and without
attention_factor / beta overrides / truncate, linear, llama3), transformers' own inverse
frequencies and attention scaling (the cos/sin multiplier), read off the model's rotary
embedding module: kiln's tests compare the frequencies its converter derives from the same
config against them.

usage: record_goldens.py OUT_DIR [--rope-probes FILE] [ARCH ...]
"""
import json
import math
import os
import sys

import torch
import transformers

VOCAB = 256
SEQ_LENS = (7, 19, 40)
GREEDY_PROMPT_LEN = 8
GREEDY_NEW = 64


def configs():
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    hybrid = dict(common, num_hidden_layers=4, head_dim=32, full_attention_interval=2,
                  linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                  linear_num_key_heads=2, linear_num_value_heads=4,
                  rope_parameters=dict(rope_type="default", rope_theta=1e6,
                                       partial_rotary_factor=0.25, mrope_section=[2, 1, 1],
                                       mrope_interleaved=True))
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
               shared_expert_intermediate_size=48)
    out = {
        "llama": (transformers.LlamaConfig, dict(common, rope_theta=10000.0,
                                                 tie_word_embeddings=False)),
        "llama_tied": (transformers.LlamaConfig, dict(common, rope_theta=500000.0,
                                                      tie_word_embeddings=True)),
        "llama3_rope": (transformers.LlamaConfig, dict(common, rope_theta=500000.0,
                        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                          high_freq_factor=4.0,
                                          original_max_position_embeddings=32))),
        "qwen2": (transformers.Qwen2Config, dict(common, rope_theta=1000000.0,
                                                 tie_word_embeddings=True)),
        "qwen3": (transformers.Qwen3Config, dict(common, head_dim=32, rope_theta=1000000.0,
                                                 tie_word_embeddings=False)),
        "qwen3moe": (transformers.Qwen3MoeConfig, dict(common, head_dim=16, rope_theta=1e6,
                     num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                     norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                     tie_word_embeddings=False)),
        "mistral_swa": (transformers.MistralConfig, dict(common, rope_theta=10000.0,
                        sliding_window=8, tie_word_embeddings=False)),
        "gemma2": (transformers.Gemma2Config, dict(common, head_dim=16, rope_theta=10000.0,
                   query_pre_attn_scalar=16, sliding_window=8, final_logit_softcapping=30.0,
                   attn_logit_softcapping=50.0, hidden_activation="gelu_pytorch_tanh")),
        "gemma3": (transformers.Gemma3TextConfig, dict(common, head_dim=16, rope_theta=1e6,
                   rope_local_base_freq=10000.0, query_pre_attn_scalar=16, sliding_window=8,
                   sliding_window_pattern=2, hidden_activation="gelu_pytorch_tanh")),
        "phi3": (transformers.Phi3Config, dict(common, rope_theta=10000.0,
                                               tie_word_embeddings=False)),
        # YaRN past its original context: the 40-token sequence and the greedy run (72
        # positions) go beyond original_max_position_embeddings (32). max_position_embeddings
        # is factor * original so every transformers version derives the same factor.
        "qwen3_yarn": (transformers.Qwen3Config, dict(common, head_dim=32, rope_theta=10000.0,
                       max_position_embeddings=128, tie_word_embeddings=False,
                       rope_scaling=dict(rope_type="yarn", factor=4.0,
                                         original_max_position_embeddings=32))),
        "llama_linear": (transformers.LlamaConfig, dict(common, rope_theta=10000.0,
                         tie_word_embeddings=False,
                         rope_scaling=dict(rope_type="linear", factor=2.0))),
        # Hybrid linear attention (Gated DeltaNet) + gated full attention: layers alternate
        # (full_attention_interval 2), twice as many value heads as key heads (the converter
        # reorders them), a quarter of each head rotated.
        "qwen35": (transformers.Qwen3_5TextConfig, dict(hybrid, tie_word_embeddings=False)),
        "qwen35moe": (transformers.Qwen3_5MoeTextConfig, dict(hybrid, **moe, tie_word_embeddings=False)),
        "qwen3next": (transformers.Qwen3NextConfig, dict(hybrid, **moe, decoder_sparse_step=1,
                                                         mlp_only_layers=[], norm_topk_prob=True,
                                                         tie_word_embeddings=False)),
    }
    return out


# Sequences recorded per architecture where the default lengths are too short: the hybrid
# models' chunked delta rule works in chunks of 64, so one sequence spans several chunks.
EXTRA_SEQ_LENS = {"qwen35": (150,), "qwen35moe": (150,), "qwen3next": (150,)}


def make_config(cfg_cls, kw):
    """cfg_cls(**kw), making sure rope_scaling took effect (transformers 5 keeps it under
    rope_parameters; should a version ignore the old keyword, pass it the new way)."""
    cfg = cfg_cls(**kw)
    want = kw.get("rope_scaling")
    if want is None:
        return cfg
    have = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if have.get("rope_type", have.get("type")) == want["rope_type"]:
        return cfg
    kw = dict(kw)
    kw.pop("rope_scaling")
    kw["rope_parameters"] = dict(want, rope_theta=kw.pop("rope_theta", 10000.0))
    return cfg_cls(**kw)


def randomise(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):  # decays exp(g) near 1, so the state carries far
                p.copy_(torch.empty(p.shape).uniform_(0.02, 0.5, generator=gen).log())
            elif p.ndim == 1:
                if "norm" in name or "layernorm" in name:
                    p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
                else:  # biases
                    p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))


def rope_probes():
    """(name, LlamaConfig kwargs) of rope configurations whose frequencies are recorded."""
    base = dict(vocab_size=VOCAB, hidden_size=512, intermediate_size=128, num_hidden_layers=1,
                num_attention_heads=4, num_key_value_heads=4)
    yarn = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32768)
    return [
        # Qwen3's recommended yarn block: max_position_embeddings is not factor * original.
        ("yarn_qwen3", dict(base, head_dim=128, rope_theta=1e6, max_position_embeddings=40960,
                            rope_scaling=dict(yarn))),
        ("yarn_consistent", dict(base, head_dim=128, rope_theta=1e6,
                                 max_position_embeddings=131072, rope_scaling=dict(yarn))),
        ("yarn_no_orig", dict(base, head_dim=64, rope_theta=10000.0,
                              max_position_embeddings=4096,
                              rope_scaling=dict(rope_type="yarn", factor=8.0))),
        ("yarn_overrides", dict(base, head_dim=64, rope_theta=10000.0,
                                max_position_embeddings=32768,
                                rope_scaling=dict(yarn, factor=8.0,
                                                  original_max_position_embeddings=4096,
                                                  attention_factor=0.8, beta_fast=16.0,
                                                  beta_slow=2.0))),
        ("yarn_no_truncate", dict(base, head_dim=64, rope_theta=150000.0,
                                  max_position_embeddings=131072,
                                  rope_scaling=dict(yarn, factor=32.0,
                                                    original_max_position_embeddings=4096,
                                                    beta_fast=32.0, beta_slow=1.0,
                                                    truncate=False))),
        ("yarn_mscale", dict(base, head_dim=64, rope_theta=10000.0,
                             max_position_embeddings=163840,
                             rope_scaling=dict(yarn, factor=40.0,
                                               original_max_position_embeddings=4096,
                                               mscale=1.0, mscale_all_dim=1.0))),
        ("linear", dict(base, head_dim=64, rope_theta=10000.0, max_position_embeddings=4096,
                        rope_scaling=dict(rope_type="linear", factor=2.0))),
        ("llama3", dict(base, head_dim=128, rope_theta=500000.0, max_position_embeddings=131072,
                        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                          high_freq_factor=4.0,
                                          original_max_position_embeddings=8192))),
    ]


def record_rope_probes(path):
    from transformers.models.llama import modeling_llama
    out = {"transformers": transformers.__version__, "probes": []}
    for name, kw in rope_probes():
        try:
            cfg = make_config(transformers.LlamaConfig, kw)
            emb = modeling_llama.LlamaRotaryEmbedding(config=cfg)
            out["probes"].append(dict(
                name=name, config=json.loads(cfg.to_json_string()),
                inv_freq=[float(x) for x in emb.inv_freq.double().tolist()],
                attention_scaling=float(emb.attention_scaling)))
            print(f"probe {name}: ok", flush=True)
        except Exception as e:
            print(f"probe {name}: FAILED {type(e).__name__}: {e}", flush=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


def main():
    args = sys.argv[1:]
    out_dir = args.pop(0)
    if "--rope-probes" in args:
        i = args.index("--rope-probes")
        record_rope_probes(args[i + 1])
        del args[i:i + 2]
    wanted = set(args)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_num_threads(8)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__}
    for arch, (cfg_cls, kw) in configs().items():
        if wanted and arch not in wanted:
            continue
        try:
            cfg = make_config(cfg_cls, kw)
            cfg._attn_implementation = "eager"
            torch.manual_seed(1234)
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
            gen = torch.Generator().manual_seed(sum(map(ord, arch)))
            randomise(model, gen)
            model.eval()
            d = os.path.join(out_dir, arch)
            os.makedirs(d, exist_ok=True)
            model.save_pretrained(d, safe_serialization=True)
            lens = SEQ_LENS + EXTRA_SEQ_LENS.get(arch, ())
            seqs = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in lens]
            rows = []
            with torch.no_grad():
                for s in seqs:
                    logits = model(torch.tensor([s])).logits[0].float()
                    rows.append(logits)
                allrows = torch.cat(rows, 0).contiguous().numpy().astype("<f4")
                allrows.tofile(os.path.join(d, "logits.f32"))
                prompt = [1] + seqs[0][: GREEDY_PROMPT_LEN - 1]
                ids = list(prompt)
                for _ in range(GREEDY_NEW):  # plain greedy loop: no generation_config surprises
                    nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
                    ids.append(nxt)
            g = dict(arch=arch, vocab=VOCAB, sequences=seqs, greedy_prompt=prompt,
                     greedy_ids=ids[len(prompt):], **meta)
            with open(os.path.join(d, "goldens.json"), "w") as f:
                json.dump(g, f)
            print(f"{arch}: ok ({sum(p.numel() for p in model.parameters())} params)", flush=True)
        except Exception as e:  # record what works; report the rest
            print(f"{arch}: FAILED {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()

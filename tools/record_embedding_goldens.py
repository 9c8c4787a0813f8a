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

nomic_embed (nomic-embed-text-v1/v1.5's NomicBertModel) is not part of transformers: it is
remote code, loaded here with trust_remote_code from a local folder (never from a hub). That
folder, --nomic-remote DIR (default: build/nomic_remote under the repository root, which git
ignores), must hold the repository's two files modeling_hf_nomic_bert.py and
configuration_hf_nomic_bert.py (e.g. from GitHub aahrong/nomic-embed-text-v1.5); they are
copied into a scratch model folder beside a config.json whose auto_map names them, never into
OUT_DIR. The modeling file imports einops at the top; where einops is not installed, a
stand-in covering exactly the rearrange/repeat patterns of the text encoder's forward is
registered first (any other pattern raises), and names newer transformers moved are filled in
(they are unused by NomicBertModel's forward). The saved checkpoint is the state dict under the
names the published model.safetensors uses (embeddings.*, emb_ln.*, encoder.layers.N.*).

usage: record_embedding_goldens.py OUT_DIR [NAME ...] [--nomic-remote DIR]
       (names: qwen3_embed, bert_embed, nomic_embed)
nomic_embed on the device machine: put the two files in build/nomic_remote/ of the checkout,
run with that path carried, e.g.
  python3 tools/record_embedding_goldens.py $OUT nomic_embed --nomic-remote build/nomic_remote
and copy $OUT/nomic_embed/* into tests/fixtures/hf/nomic_embed/.
"""
import importlib.machinery
import json
import math
import os
import shutil
import sys
import tempfile
import traceback
import types

# Remote code is imported from a copy under the modules cache: keep it in a scratch folder, and
# never reach for a hub (the device machine has no network).
os.environ.setdefault("HF_MODULES_CACHE", tempfile.mkdtemp(prefix="hf_modules_"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.nn.functional as F
import transformers

VOCAB = 256
SEQ_LENS = (1, 7, 19, 40)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOMIC_FILES = ("modeling_hf_nomic_bert.py", "configuration_hf_nomic_bert.py")

# nomic-embed-text-v1.5's config.json, shrunk: the switches as published (swiglu, rotary on
# the whole head dim, rotate-half pairs, no qkv/mlp biases, post-norm, non-causal, no dropout),
# n_positions / max_trained_positions as published (llama.cpp's converter keys on the pair).
# n_inner is a multiple of 256: the gated MLP rounds its width up to one.
NOMIC = dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_inner=256, n_positions=8192,
             max_trained_positions=2048, type_vocab_size=2, layer_norm_epsilon=1e-12,
             activation_function="swiglu", rotary_emb_fraction=1.0, rotary_emb_base=1000,
             rotary_emb_interleaved=False, rotary_emb_scale_base=None, rotary_scaling_factor=None,
             qkv_proj_bias=False, mlp_fc1_bias=False, mlp_fc2_bias=False, prenorm=False,
             causal=False, use_flash_attn=False, fused_bias_fc=False, fused_dropout_add_ln=False,
             use_xentropy=False, use_rms_norm=False, parallel_block=False,
             parallel_block_tied_norm=False, dense_seq_output=True, pad_vocab_size_multiple=64,
             attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, summary_first_dropout=0.0,
             initializer_range=0.02, tie_word_embeddings=True, pad_token_id=0,
             bos_token_id=None, eos_token_id=None)


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
        # remote code (nomic_model): no classes here; nomic-embed-text ships mean pooling
        "nomic_embed": (None, None, dict(hidden_size=NOMIC["n_embd"]), ("mean", "cls"), "mean"),
    }


def einops_stand_in():
    """The rearrange/repeat patterns NomicBertModel's text forward uses, in plain torch."""
    def rearrange(x, pattern, **axes):
        p = " ".join(pattern.split())
        if p == "... (three h d) -> ... three h d":
            return x.reshape(*x.shape[:-1], axes["three"], -1, axes["d"])
        if p == "... h d -> ... (h d)":
            return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])
        if p == "... d two -> ... (d two)":
            return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])
        raise NotImplementedError(f"einops stand-in: rearrange '{pattern}'")

    def repeat(x, pattern, **axes):
        p = " ".join(pattern.split())
        if p == "... d -> ... 1 (2 d)":  # [.., d] -> [.., 1, 2d]: the d values twice over
            return torch.cat([x, x], dim=-1).unsqueeze(-2)
        if p == "... d -> ... 1 (d 2)":  # each value twice in a row
            return x.repeat_interleave(2, dim=-1).unsqueeze(-2)
        raise NotImplementedError(f"einops stand-in: repeat '{pattern}'")

    m = types.ModuleType("einops")
    m.rearrange, m.repeat, m.__version__ = rearrange, repeat, "0+kiln-stand-in"
    # transformers checks the modeling file's imports (import_module / find_spec): a spec lets
    # find_spec answer from sys.modules too.
    m.__spec__ = importlib.machinery.ModuleSpec("einops", None)
    return m


def fill_moved_transformers_names():
    """Names the modeling file imports from where transformers 4 had them; unused by the text
    forward (checkpoint download helpers, output classes of other heads)."""
    import transformers.modeling_outputs as outputs
    import transformers.models.bert.modeling_bert as bert
    import transformers.utils as utils
    import transformers.utils.hub as hub
    for name, value in (("SAFE_WEIGHTS_INDEX_NAME", "model.safetensors.index.json"),
                        ("SAFE_WEIGHTS_NAME", "model.safetensors"),
                        ("WEIGHTS_INDEX_NAME", "pytorch_model.bin.index.json"),
                        ("WEIGHTS_NAME", "pytorch_model.bin")):
        if not hasattr(utils, name):
            setattr(utils, name, value)
    for name in ("BaseModelOutputWithPoolingAndCrossAttentions", "MaskedLMOutput",
                 "SequenceClassifierOutput"):
        if not hasattr(bert, name):
            setattr(bert, name, getattr(outputs, name))
    for name in ("cached_file", "get_checkpoint_shard_files"):
        if not hasattr(hub, name):
            def unavailable(*a, _name=name, **k):
                raise RuntimeError(f"{_name} is not used when recording goldens")
            setattr(hub, name, unavailable)


def nomic_model(remote_dir):
    """NomicBertModel (no pooler, as sentence-transformers loads it) built from the remote code
    in remote_dir through transformers' trust_remote_code; returns (model, config.json dict)."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module
    missing = [f for f in NOMIC_FILES if not os.path.isfile(os.path.join(remote_dir, f))]
    if missing:
        raise FileNotFoundError(f"{remote_dir} lacks {', '.join(missing)} (see --nomic-remote)")
    try:
        import einops  # noqa: F401
    except ImportError:
        sys.modules["einops"] = einops_stand_in()
    fill_moved_transformers_names()
    cfg_json = dict(NOMIC, architectures=["NomicBertModel"], model_type="nomic_bert",
                    auto_map={"AutoConfig": "configuration_hf_nomic_bert.NomicBertConfig",
                              "AutoModel": "modeling_hf_nomic_bert.NomicBertModel"})
    scratch = tempfile.mkdtemp(prefix="nomic_remote_")
    for f in NOMIC_FILES:
        shutil.copy(os.path.join(remote_dir, f), scratch)
    with open(os.path.join(scratch, "config.json"), "w") as f:
        json.dump(cfg_json, f, indent=1)
    cfg = transformers.AutoConfig.from_pretrained(scratch, trust_remote_code=True)
    cls = get_class_from_dynamic_module(cfg_json["auto_map"]["AutoModel"], scratch)
    if not hasattr(cls, "get_extended_attention_mask"):  # gone from newer PreTrainedModel
        def get_extended_attention_mask(self, mask, input_shape):
            m = mask[:, None, None, :].to(self.dtype)
            return (1.0 - m) * torch.finfo(self.dtype).min
        cls.get_extended_attention_mask = get_extended_attention_mask
    model = cls(cfg, add_pooling_layer=False)
    return model, cfg_json


def randomise(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                if "norm" in name.lower() or name.startswith("emb_ln"):
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
    nomic_remote = os.path.join(REPO, "build", "nomic_remote")
    if "--nomic-remote" in args:
        i = args.index("--nomic-remote")
        nomic_remote = args[i + 1]
        del args[i:i + 2]
    out_dir = args.pop(0)
    wanted = set(args)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_num_threads(8)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__}
    for name, (model_cls, cfg_cls, kw, modes, shipped) in configs().items():
        if wanted and name not in wanted:
            continue
        try:
            torch.manual_seed(1234)
            if model_cls is None:
                model, cfg_json = nomic_model(nomic_remote)
                model = model.to(torch.float32)
            else:
                cfg = cfg_cls(**kw)
                cfg._attn_implementation = "eager"
                model = model_cls(cfg).to(torch.float32)
            gen = torch.Generator().manual_seed(sum(map(ord, name)))
            randomise(model, gen)
            model.eval()
            d = os.path.join(out_dir, name)
            os.makedirs(d, exist_ok=True)
            if model_cls is None:  # the published checkpoint's layout: state dict + config.json
                from safetensors.torch import save_file
                save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                          os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
                with open(os.path.join(d, "config.json"), "w") as f:
                    json.dump(cfg_json, f, indent=1)
            else:
                model.save_pretrained(d, safe_serialization=True)
            write_st_layout(d, kw["hidden_size"], shipped)
            seqs = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in SEQ_LENS]
            pooled = {m: [] for m in modes}
            normalized = {m: [] for m in modes}
            with torch.no_grad():
                for s in seqs:  # one sequence per forward, no padding
                    ids = torch.tensor([s])
                    mask = torch.ones_like(ids)
                    bertish = "bert" in name or "nomic" in name
                    extra = {"token_type_ids": torch.zeros_like(ids)} if bertish else {}
                    h = model(input_ids=ids, attention_mask=mask, **extra).last_hidden_state
                    h = h.float()
                    for m in modes:
                        p = pool(m, h, mask)
                        pooled[m].append([float(x) for x in p[0].tolist()])
                        normalized[m].append([float(x) for x in F.normalize(p, p=2, dim=1)[0].tolist()])
            model_name = model_cls.__name__ if model_cls else type(model).__name__
            more = {}
            if model_cls is None:
                more["einops"] = getattr(sys.modules.get("einops"), "__version__", "?")
            g = dict(name=name, model=model_name, vocab=VOCAB,
                     hidden=kw["hidden_size"], shipped_pooling=shipped, sequences=seqs,
                     pooled=pooled, normalized=normalized, **meta, **more)
            with open(os.path.join(d, "goldens.json"), "w") as f:
                json.dump(g, f)
            print(f"{name}: ok ({sum(p.numel() for p in model.parameters())} params)",
                  flush=True)
        except Exception as e:  # record what works; report the rest
            print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()


if __name__ == "__main__":
    main()

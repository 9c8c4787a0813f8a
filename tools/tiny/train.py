#!/usr/bin/env python3
"""Trains kiln-tiny: a small Llama (RMSNorm, rotate-half rope, SwiGLU, GQA, tied embeddings)
pretrained on the corpus and fine-tuned on the SFT conversations, scheduled by wall time.

  train.py --data DATA --tok TOKDIR --out OUT --minutes 15 [--smoke]

DATA: corpus/train.txt.xz, corpus/heldout.txt, sft/train.jsonl.xz, sft/heldout.jsonl,
eval_words.json. TOKDIR: tokenizer.json + tokenizer_config.json (train_tokenizer.py).
OUT gets: config.json, *.safetensors (bf16, HF LlamaForCausalLM names), tokenizer files,
log.jsonl (loss curve), eval.json (held-out perplexity computed like `kiln perplexity`,
reference logits and greedy continuations, sample answers).

Works on CUDA with torch >= 2 (bf16 autocast, scaled_dot_product_attention, torch.compile)
and on the CPU with torch 1.13 (plain attention) for smoke tests.
"""
import argparse
import json
import lzma
import math
import os
import random
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


# ----------------------------------------------------------------------------- model

class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


HAS_SDPA = hasattr(F, "scaled_dot_product_attention")
DROPOUT = 0.0  # residual-branch dropout while training (--dropout)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, hd = c["hidden_size"], c["head_dim"]
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], hd
        self.q_proj = nn.Linear(d, self.nh * hd, bias=False)
        self.k_proj = nn.Linear(d, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(d, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        if HAS_SDPA:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            a = s.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.o_proj(a.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin):
        p = DROPOUT if self.training else 0.0
        x = x + F.dropout(self.self_attn(self.input_layernorm(x), cos, sin), p, self.training)
        return x + F.dropout(self.mlp(self.post_attention_layernorm(x)), p, self.training)


class Body(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class Llama(nn.Module):
    """Parameter names are Hugging Face LlamaForCausalLM's (model.layers.N.self_attn...)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Body(c)
        hd = c["head_dim"]
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        pos = torch.arange(c["max_position_embeddings"], dtype=torch.float64)
        fr = torch.outer(pos, inv)
        emb = torch.cat((fr, fr), dim=-1)
        self.register_buffer("cos", emb.cos().float(), persistent=False)
        self.register_buffer("sin", emb.sin().float(), persistent=False)
        std = 0.02
        for n, p in self.named_parameters():
            if p.dim() == 2:
                s = std / math.sqrt(2 * c["num_hidden_layers"]) if (
                    n.endswith("o_proj.weight") or n.endswith("down_proj.weight")) else std
                nn.init.normal_(p, 0.0, s)

    def hidden(self, ids):
        T = ids.shape[1]
        x = self.model.embed_tokens(ids)
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.model.norm(x)

    def forward(self, ids):
        return F.linear(self.hidden(ids), self.model.embed_tokens.weight)


def loss_fn(model, x, y, m):
    logits = model(x)
    l = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
    m = m.reshape(-1).float()
    return (l * m).sum() / m.sum().clamp(min=1.0)


# ----------------------------------------------------------------------------- data

class Tok:
    """HF tokenizers when installed; else the bytes-only tokenizer of train_tokenizer.py
    --bytes-only (specials, then the 256 bytes), for CPU smoke tests."""

    def __init__(self, tok_dir):
        self.specials = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
        try:
            from tokenizers import Tokenizer
            self.hf = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
            for s in self.specials:
                self.specials[s] = self.hf.token_to_id(s)
        except ImportError:
            self.hf = None
        self.eot = self.specials["<|endoftext|>"]
        self.im_end = self.specials["<|im_end|>"]

    def _bytes_encode(self, text):
        import re
        out, offs = [], []
        pat = "(" + "|".join(re.escape(s) for s in self.specials) + ")"
        pos = 0
        for part in re.split(pat, text):
            if part in self.specials:
                out.append(self.specials[part])
                offs.append(pos)
            else:
                for ch_i, ch in enumerate(part):
                    for b in ch.encode("utf-8"):
                        out.append(3 + b)
                        offs.append(pos + ch_i)
            pos += len(part)
        return out, offs

    def encode_batch(self, texts, offsets=False):
        if self.hf is not None:
            encs = self.hf.encode_batch(texts)
            if offsets:
                return [(e.ids, [o[0] for o in e.offsets]) for e in encs]
            return [e.ids for e in encs]
        r = [self._bytes_encode(t) for t in texts]
        return r if offsets else [a for a, _ in r]

    def encode(self, text):
        return self.encode_batch([text])[0]

    def decode(self, ids):
        if self.hf is not None:
            return self.hf.decode(ids, skip_special_tokens=False)
        inv = {v: k for k, v in self.specials.items()}
        bs = b""
        for i in ids:
            bs += inv[i].encode() if i in inv else bytes([i - 3])
        return bs.decode("utf-8", errors="replace")


def read_docs(path, limit_bytes=None):
    op = lzma.open if path.endswith(".xz") else open
    docs, cur, n = [], [], 0
    with op(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.rstrip("\n") == "<|endoftext|>":
                docs.append("".join(cur))
                n += len(docs[-1])
                cur = []
                if limit_bytes and n >= limit_bytes:
                    return docs
            else:
                cur.append(line)
    if cur:
        docs.append("".join(cur))
    return docs


def heldout_ppl_text(data):
    """The held-out text both train.py and `kiln perplexity` score: documents joined by a
    blank line (no special-token text, which kiln's tokenizer would not parse as special)."""
    docs = read_docs(os.path.join(data, "corpus", "heldout.txt"))
    return "\n".join(d.strip("\n") + "\n" for d in docs if d.strip())


def encode_corpus(tok, docs):
    out = []
    B = 4096
    for i in range(0, len(docs), B):
        for ids in tok.encode_batch(docs[i:i + B]):
            out.extend(ids)
            out.append(tok.eot)
    return np.array(out, dtype=np.uint16)


def read_jsonl(path, limit=None):
    op = lzma.open if path.endswith(".xz") else open
    out = []
    with op(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
                if limit and len(out) >= limit:
                    break
    return out


def assistant_spans(text):
    """Character spans trained in a rendered conversation: each assistant turn's body
    through its <|im_end|>."""
    spans, i = [], 0
    head = "<|im_start|>assistant\n"
    while True:
        j = text.find("<|im_start|>assistant", i)
        if j < 0:
            return spans
        start = j + len("<|im_start|>assistant")
        if text.startswith("\n", start):
            start += 1
        end = text.find("<|im_end|>", start)
        end = len(text) if end < 0 else end + len("<|im_end|>")
        spans.append((start, end))
        i = end


_RENDER = None


def _render_init():
    global _RENDER
    import jinja_render
    with open(os.path.join(HERE, "chat_template.jinja"), encoding="utf-8") as f:
        _RENDER = jinja_render.renderer(f.read())


def _render_one(conv):
    return _RENDER(conv)


def render_all(convs, procs):
    if procs <= 1 or len(convs) < 2000:
        _render_init()
        return [_render_one(c) for c in convs]
    import multiprocessing as mp
    with mp.get_context("fork").Pool(procs, initializer=_render_init) as pool:
        return pool.map(_render_one, convs, chunksize=500)


def encode_sft(tok, convs, procs=1):
    texts = render_all(convs, procs)
    ids_parts, mask_parts, starts = [], [], []
    n = 0
    eot = np.array([tok.eot], dtype=np.uint16)
    zero = np.zeros(1, dtype=np.uint8)
    B = 4096
    for i in range(0, len(texts), B):
        for t, (ids, offs) in zip(texts[i:i + B], tok.encode_batch(texts[i:i + B], offsets=True)):
            o = np.asarray(offs, dtype=np.int64)
            m = np.zeros(len(ids), dtype=np.uint8)
            for s0, e0 in assistant_spans(t):
                m[(o >= s0) & (o < e0)] = 1
            starts.append(n)
            ids_parts += [np.asarray(ids, dtype=np.uint16), eot]
            mask_parts += [m, zero]
            n += len(ids) + 1
    return (np.concatenate(ids_parts), np.concatenate(mask_parts), np.array(starts, dtype=np.int64))


# ----------------------------------------------------------------------------- export

def save_safetensors(tensors, path):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = t.detach().to(torch.bfloat16).contiguous().cpu().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def export(model, c, tok_dir, out, shard_bytes):
    sd = {k: v for k, v in model.state_dict().items()}
    shards, cur, size = [], {}, 0
    for k, v in sd.items():
        nb = v.numel() * 2
        if cur and size + nb > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = v
        size += nb
    shards.append(cur)
    for i, s in enumerate(shards):
        save_safetensors(s, os.path.join(out, f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"))
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": c["vocab_size"], "hidden_size": c["hidden_size"],
        "intermediate_size": c["intermediate_size"], "num_hidden_layers": c["num_hidden_layers"],
        "num_attention_heads": c["num_attention_heads"],
        "num_key_value_heads": c["num_key_value_heads"], "head_dim": c["head_dim"],
        "max_position_embeddings": c["max_position_embeddings"], "rms_norm_eps": c["rms_norm_eps"],
        "rope_theta": c["rope_theta"], "tie_word_embeddings": True, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16",
        "bos_token_id": None, "eos_token_id": c["eos_token_id"],
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for n in ("tokenizer.json", "tokenizer_config.json", "tokenizer_ids.json"):
        if os.path.exists(os.path.join(tok_dir, n)):
            shutil.copy(os.path.join(tok_dir, n), os.path.join(out, n))
    return len(shards)


def q8_0_roundtrip(w):
    """kiln's Q8_0 (src/kiln/quant/quantize.cpp q8_levels) then dequantized, in fp32: blocks
    of 32 along rows, d = fp16(amax / 127), q = round(x / d) half away from zero, clamped to
    +-127. (ggml's reference divides by the unrounded d; kiln rounds against the stored one.)"""
    shape = w.shape
    x = w.float().reshape(-1, 32)
    dh = (x.abs().amax(dim=1, keepdim=True) / 127.0).half().float()
    inv = torch.where(dh > 0, 1.0 / dh, torch.zeros_like(dh))
    v = (x * inv).clamp(-127.0, 127.0)
    q = torch.sign(v) * torch.floor(v.abs() + 0.5)  # roundf: half away from zero
    return (q * dh).reshape(shape)


def load_safetensors_dir(d):
    """{name: fp32 tensor} from the bf16 safetensors that export() writes."""
    out = {}
    for fn in sorted(os.listdir(d)):
        if not fn.endswith(".safetensors"):
            continue
        with open(os.path.join(d, fn), "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
            base = 8 + n
            blob = f.read()
        for name, info in header.items():
            if name == "__metadata__":
                continue
            assert info["dtype"] == "BF16", info["dtype"]
            b0, b1 = info["data_offsets"]
            raw = np.frombuffer(blob[b0:b1], dtype=np.uint16).astype(np.uint32) << 16
            out[name] = torch.from_numpy(raw.view(np.float32).copy()).reshape(info["shape"])
    return out


# ----------------------------------------------------------------------------- eval

@torch.no_grad()
def perplexity(model, ids, n_ctx, max_chunks=None, batch=16, dev="cpu"):
    """llama-perplexity's (and `kiln perplexity`'s) measure: non-overlapping chunks of n_ctx
    tokens, each from position 0, scoring the predictions of tokens first+1 .. n_ctx-1 with
    first = n_ctx / 2. Returns ppl, its +/- and the per-chunk running ppl."""
    n_chunk = len(ids) // n_ctx
    if max_chunks:
        n_chunk = min(n_chunk, max_chunks)
    first = n_ctx // 2
    nll = nll2 = 0.0
    count = 0
    running = []
    for c0 in range(0, n_chunk, batch):
        c1 = min(n_chunk, c0 + batch)
        x = torch.tensor(np.stack([ids[i * n_ctx:(i + 1) * n_ctx] for i in range(c0, c1)]).astype(np.int64),
                         device=dev)
        logits = model(x)[:, first:n_ctx - 1].double()
        lp = logits.log_softmax(-1).gather(-1, x[:, first + 1:n_ctx, None]).squeeze(-1)
        for r in range(lp.shape[0]):
            row = -lp[r]
            nll += row.sum().item()
            nll2 += (row * row).sum().item()
            count += row.numel()
            running.append(math.exp(nll / count))
    mean = nll / count
    var = nll2 / count - mean * mean
    err = math.sqrt(var / (count - 1)) * math.exp(mean) if var > 0 and count > 1 else 0.0
    return {"ppl": math.exp(mean), "ppl_err": err, "n_ctx": n_ctx, "chunks": n_chunk,
            "tokens_scored": count, "nll_per_token": mean, "running": running}


@torch.no_grad()
def greedy(model, ids, n, stop=None, dev="cpu"):
    ids = list(ids)
    out = []
    for _ in range(n):
        x = torch.tensor([ids[-model.c["max_position_embeddings"]:]], device=dev)
        t = int(model(x)[0, -1].argmax())
        out.append(t)
        ids.append(t)
        if stop is not None and t == stop:
            break
    return out


def fp32_copy(model, c, dev, q8=False):
    """An fp32 model holding the exported weights: bf16-rounded (or Q8_0 round-tripped)."""
    m = Llama(c).to(dev)
    sd = {}
    for k, v in model.state_dict().items():
        v = v.detach().to(torch.bfloat16).float()
        if q8 and v.dim() == 2:
            v = q8_0_roundtrip(v)
        sd[k] = v
    m.load_state_dict(sd)
    m.eval()
    return m


REF_PROMPTS = [
    "Once upon a time",
    "The meaning of the word",
    "In the beginning God created",
]


def evaluate(model, c, tok, data, render, dev, out, max_chunks, eval_words):
    log("eval: exported-weight fp32 models")
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    res = {}
    text = heldout_ppl_text(data)
    with open(os.path.join(out, "heldout_ppl.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    ids = np.array(tok.encode(text), dtype=np.int64)
    res["heldout_tokens"] = int(len(ids))
    chat_prompts = [render({"messages": [{"role": "user", "content": p}]}, True)
                    for p in ("What does happy mean?", "What is 2 + 3?")]
    for name, q8 in (("bf16", False), ("q8_0", True)):
        m = fp32_copy(model, c, dev, q8=q8)
        r = {"ppl_all": perplexity(m, ids, c["max_position_embeddings"], None, dev=dev),
             "ppl_4chunks": perplexity(m, ids, min(256, c["max_position_embeddings"]), 4, dev=dev)}
        refs = []
        for p in REF_PROMPTS + chat_prompts:
            pid = tok.encode(p)
            x = torch.tensor([pid], device=dev)
            logits = m(x)[0].float().cpu()
            refs.append({"prompt": p, "ids": pid, "last_logits": logits[-1].tolist(),
                         "greedy32": greedy(m, pid, 32, dev=dev)})
        r["refs"] = refs
        res[name] = r
        log(f"eval {name}: heldout ppl {r['ppl_all']['ppl']:.4f} over {r['ppl_all']['chunks']} chunks;"
            f" 4 chunks {r['ppl_4chunks']['ppl']:.4f}")
    # Samples: greedy answers through the chat template (bf16 weights).
    m = fp32_copy(model, c, dev, q8=False)
    samples = []
    for w in eval_words:
        p = render({"messages": [{"role": "user", "content": f"What does {w['word']} mean?"}]}, True)
        ans = tok.decode(greedy(m, tok.encode(p), 48, stop=tok.im_end, dev=dev))
        samples.append({"word": w["word"], "answer": ans,
                        "hit": any(k.lower() in ans.lower() for k in w.get("keywords", []))})
    tools = [{"type": "function", "function": {"name": "dictionary",
              "description": "Look up the definition of an English word",
              "parameters": {"type": "object", "properties": {"word": {"type": "string"}},
                             "required": ["word"]}}}]
    for q in ("What does the word 'lantern' mean? Use the dictionary.", "Define river."):
        p = render({"messages": [{"role": "user", "content": q}], "tools": tools}, True)
        samples.append({"tool_prompt": q, "answer": tok.decode(greedy(m, tok.encode(p), 48, stop=tok.im_end, dev=dev))})
    for q in ("Once upon a time", "The sea was"):
        samples.append({"completion": q, "answer": tok.decode(greedy(m, tok.encode(q), 48, dev=dev))})
    res["samples"] = samples
    hits = sum(1 for s in samples if s.get("hit"))
    log(f"samples: {hits}/{len(eval_words)} definition keyword hits")
    for s in samples[:6] + samples[-4:]:
        log("sample:", json.dumps(s, ensure_ascii=False)[:300])
    with open(os.path.join(out, "eval.json"), "w", encoding="utf-8") as f:
        json.dump(res, f, ensure_ascii=False)
    return res


# ----------------------------------------------------------------------------- train

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--tok", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=1536)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--sft-start", type=float, default=0.55, help="time fraction: SFT mixing begins")
    ap.add_argument("--decay-start", type=float, default=0.75, help="time fraction: lr decay + SFT-heavy")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--corpus-mb", type=float, default=0, help="limit corpus (smoke)")
    ap.add_argument("--sft-limit", type=int, default=0)
    ap.add_argument("--eval-chunks", type=int, default=0)
    ap.add_argument("--shard-mb", type=float, default=15.0)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=16)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    global DROPOUT
    DROPOUT = a.dropout
    random.seed(a.seed)
    np.random.seed(a.seed)
    torch.manual_seed(a.seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu":
        torch.set_num_threads(a.threads)
    log("torch", torch.__version__, "device", dev, "sdpa", HAS_SDPA, "args", vars(a))

    import jinja_render
    with open(os.path.join(HERE, "chat_template.jinja"), encoding="utf-8") as f:
        render = jinja_render.renderer(f.read())
    tok = Tok(a.tok)
    vocab = tok.hf.get_vocab_size() if tok.hf is not None else 259
    vocab = (vocab + 63) // 64 * 64
    c = {"vocab_size": vocab, "hidden_size": a.d, "intermediate_size": a.ffn,
         "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
         "num_key_value_heads": a.kv_heads, "head_dim": a.d // a.heads,
         "max_position_embeddings": a.ctx, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "eos_token_id": tok.im_end}

    # Data.
    docs = read_docs(os.path.join(a.data, "corpus", "train.txt.xz"),
                     int(a.corpus_mb * 1e6) if a.corpus_mb else None)
    log(f"corpus: {len(docs)} docs, {sum(len(d) for d in docs) / 1e6:.1f} M chars")
    corpus = encode_corpus(tok, docs)
    del docs
    convs = read_jsonl(os.path.join(a.data, "sft", "train.jsonl.xz"), a.sft_limit or None)
    sft_ids, sft_mask, sft_starts = encode_sft(tok, convs, a.threads)
    hconvs = read_jsonl(os.path.join(a.data, "sft", "heldout.jsonl"), 2000)
    hs_ids, hs_mask, hs_starts = encode_sft(tok, hconvs, 1)
    held = np.array(tok.encode(heldout_ppl_text(a.data)), dtype=np.uint16)
    log(f"tokens: corpus {len(corpus) / 1e6:.2f} M, sft {len(sft_ids) / 1e6:.2f} M "
        f"({sft_mask.mean() * 100:.0f}% trained) from {len(convs)} conversations, "
        f"heldout {len(held)}, sft heldout {len(hs_ids)}")
    with open(os.path.join(a.out, "data_stats.json"), "w") as f:
        json.dump({"corpus_tokens": int(len(corpus)), "sft_tokens": int(len(sft_ids)),
                   "sft_trained_tokens": int(sft_mask.sum()), "sft_conversations": len(convs),
                   "heldout_tokens": int(len(held))}, f)
    T = a.ctx
    corpus_t = torch.from_numpy(corpus.astype(np.int64)).to(dev)
    sft_t = torch.from_numpy(sft_ids.astype(np.int64)).to(dev)
    sftm_t = torch.from_numpy(sft_mask.astype(np.int64)).to(dev)
    # Pad the SFT stream so a window from any conversation start fits.
    pad = torch.full((T + 1,), tok.eot, dtype=torch.int64, device=dev)
    sft_t = torch.cat([sft_t, pad])
    sftm_t = torch.cat([sftm_t, torch.zeros(T + 1, dtype=torch.int64, device=dev)])
    sft_starts_t = torch.from_numpy(sft_starts).to(dev)
    ar = torch.arange(T + 1, device=dev)

    def batch(n_sft):
        B = a.batch
        n_pre = B - n_sft
        xs, ms = [], []
        if n_pre:
            o = torch.randint(0, len(corpus_t) - T - 1, (n_pre,), device=dev)
            xs.append(corpus_t[o[:, None] + ar])
            ms.append(torch.ones(n_pre, T, dtype=torch.int64, device=dev))
        if n_sft:
            o = sft_starts_t[torch.randint(0, len(sft_starts_t), (n_sft,), device=dev)]
            xs.append(sft_t[o[:, None] + ar])
            ms.append(sftm_t[o[:, None] + ar][:, 1:])
        x = torch.cat(xs)
        return x[:, :-1], x[:, 1:], torch.cat(ms)

    def fixed_eval_batches(ids, mask, starts, n, seed):
        g = np.random.RandomState(seed)
        out = []
        for _ in range(n):
            if starts is None:
                o = g.randint(0, len(ids) - T - 1, size=8)
                x = np.stack([ids[i:i + T + 1] for i in o]).astype(np.int64)
                m = np.ones((8, T), dtype=np.int64)
            else:
                pid = np.concatenate([ids, np.full(T + 1, tok.eot, dtype=ids.dtype)])
                pm = np.concatenate([mask, np.zeros(T + 1, dtype=mask.dtype)])
                o = starts[g.randint(0, len(starts), size=8)]
                x = np.stack([pid[i:i + T + 1] for i in o]).astype(np.int64)
                m = np.stack([pm[i + 1:i + T + 1] for i in o]).astype(np.int64)
            x = torch.from_numpy(x).to(dev)
            out.append((x[:, :-1], x[:, 1:], torch.from_numpy(m).to(dev)))
        return out

    ev_pre = fixed_eval_batches(held, None, None, 4, 1)
    ev_sft = fixed_eval_batches(hs_ids, hs_mask, hs_starts, 4, 2)

    model = Llama(c).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f} M params, config {c}")
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() == 2 else no_decay).append(p)
    opt_kw = {"fused": True} if dev == "cuda" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, **opt_kw)
    step_fn = model
    if a.compile and hasattr(torch, "compile"):
        step_fn = torch.compile(model)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev == "cuda" else torch.autocast("cpu", enabled=False)

    @torch.no_grad()
    def eval_loss(batches):
        model.eval()
        tot = 0.0
        for x, y, m in batches:
            with amp:
                tot += loss_fn(step_fn, x, y, m).item()
        model.train()
        return tot / len(batches)

    budget = a.minutes * 60.0
    logf = open(os.path.join(a.out, "log.jsonl"), "w")
    t_start = time.time()
    step, tokens, sft_tokens = 0, 0, 0
    last_eval = -1e9
    ema = None
    while True:
        el = time.time() - t_start
        frac = el / budget
        if frac >= 1.0 or (a.max_steps and step >= a.max_steps):
            break
        if a.max_steps:
            frac = max(frac, step / a.max_steps)
        if frac < a.sft_start:
            p_sft = 0.0
        elif frac < a.decay_start:
            p_sft = 0.15
        else:
            p_sft = 0.7
        n_sft = int(np.random.binomial(a.batch, p_sft)) if p_sft > 0 else 0
        if frac < a.decay_start:
            lr = a.lr * min(1.0, (step + 1) / a.warmup)
        else:
            lr = a.lr * max(0.02, 1.0 - (frac - a.decay_start) / (1.0 - a.decay_start))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y, m = batch(n_sft)
        with amp:
            loss = loss_fn(step_fn, x, y, m)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += x.numel()
        sft_tokens += n_sft * T
        if step % 10 == 0 or step <= 3:
            lv = loss.item()
            ema = lv if ema is None else 0.9 * ema + 0.1 * lv
            now = time.time() - t_start
            rec = {"step": step, "t": round(now, 2), "frac": round(frac, 4), "lr": lr,
                   "loss": lv, "loss_ema": ema, "grad_norm": float(gn), "n_sft": n_sft,
                   "tokens": tokens, "tok_per_s": tokens / max(now, 1e-9)}
            if now - last_eval > max(20.0, budget / 40) or step <= 1:
                rec["eval_corpus"] = eval_loss(ev_pre)
                rec["eval_sft"] = eval_loss(ev_sft)
                last_eval = now
                log(f"step {step} t {now:.0f}s lr {lr:.2e} loss {lv:.3f} ema {ema:.3f} "
                    f"eval corpus {rec['eval_corpus']:.3f} sft {rec['eval_sft']:.3f} "
                    f"tok/s {rec['tok_per_s']:.0f} tokens {tokens / 1e6:.1f}M")
            logf.write(json.dumps(rec) + "\n")
            logf.flush()
    train_s = time.time() - t_start
    fin = {"step": step, "t": round(train_s, 2), "final": True, "tokens": tokens,
           "sft_tokens": sft_tokens, "tok_per_s": tokens / train_s,
           "eval_corpus": eval_loss(ev_pre), "eval_sft": eval_loss(ev_sft), "params": n_params}
    logf.write(json.dumps(fin) + "\n")
    logf.close()
    log("done training:", json.dumps(fin))
    n_shards = export(model, c, a.tok, a.out, int(a.shard_mb * 1e6))
    log(f"exported {n_shards} shards to {a.out}")
    eval_words = []
    ew = os.path.join(a.data, "eval_words.json")
    if os.path.exists(ew):
        with open(ew) as f:
            eval_words = json.load(f)
        if isinstance(eval_words, dict):
            eval_words = eval_words.get("words", [])
    evaluate(model, c, tok, a.data, render, dev, a.out, a.eval_chunks, eval_words)
    with open(os.path.join(a.out, "DONE"), "w") as f:
        f.write("done\n")
    log("all done")


if __name__ == "__main__":
    main()

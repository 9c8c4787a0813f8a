#!/bin/bash
# kiln perplexity on the bundled kiln-tiny (models/kiln-tiny.gguf, Q8_0) over the first
# chunks of the held-out text agrees within 1% with the perplexity tools/tiny/train.py
# computed in PyTorch (fp32, on the GPU machine) from the exported bf16 weights, with the
# same chunking (tests/fixtures/kiln_tiny/reference.json: ppl_bf16_small). (An F32
# conversion gives train.py's number to 4 decimals; Q8_0 moves it by about 0.2%.)
#   tiny_perplexity_test.sh KILN_BIN SOURCE_DIR
set -euo pipefail
kiln=$1
src=$2
fx=$src/tests/fixtures/kiln_tiny
read -r ctx chunks expected < <(python3 -c "
import json; r = json.load(open('$fx/reference.json'))['ppl_bf16_small']
print(r['n_ctx'], r['chunks'], r['ppl'])")
out=$("$kiln" perplexity -m "$src/models/kiln-tiny.gguf" -f "$fx/heldout_head.txt" -c "$ctx" \
      --chunks "$chunks" -t 2 2>/dev/null)
echo "$out"
got=$(echo "$out" | sed -n 's/^Final estimate: PPL = \([0-9.]*\) .*/\1/p')
[ -n "$got" ] || { echo "FAIL: no 'Final estimate' line"; exit 1; }
python3 -c "
got, exp = $got, $expected
rel = abs(got - exp) / exp
print(f'kiln {got:.4f}  train.py {exp:.4f}  relative difference {rel:.5f}')
assert rel < 0.01, 'perplexities differ by more than 1%'
"
# The default-model lookup fails clearly when $KILN_MODEL names nothing.
if msg=$(KILN_MODEL=/nonexistent/kiln-tiny.gguf "$kiln" run -p hi 2>&1); then
  echo "FAIL: kiln run with a bad \$KILN_MODEL succeeded"; exit 1
fi
echo "$msg" | grep -q "KILN_MODEL names '/nonexistent/kiln-tiny.gguf', which does not exist" ||
  { echo "FAIL: unexpected error: $msg"; exit 1; }
echo PASS

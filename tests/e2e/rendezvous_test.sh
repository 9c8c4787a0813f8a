#!/usr/bin/env bash
# The multi-node rendezvous between two kiln processes over loopback (`kiln doctor --nnodes 2`):
# both print both nodes' lines in node order (a node that starts before node 0 waits for it:
# the unit test). A process with the wrong --nnodes is refused by name; a node alone gives up
# at its deadline with exit 1.
set -euo pipefail
kiln="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"; kill $(jobs -p) 2>/dev/null || true' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Node 0 on any free port (it says which), then node 1, then a node with the wrong --nnodes.
start_master() {  # $1: log; sets port and master
  "$kiln" doctor --nnodes 2 --node-rank 0 --master-addr 127.0.0.1:0 --rendezvous-timeout 20 \
    > "$1" 2> "$1.err" &
  master=$!
  for _ in $(seq 100); do
    port=$(sed -n 's/^rendezvous: node 0 listening on 127.0.0.1:\([0-9]*\)$/\1/p' "$1.err")
    [ -n "$port" ] && return 0
    sleep 0.1
  done
  fail "node 0 does not listen: $(cat "$1.err")"
}
start_master "$work/n0.txt"
"$kiln" doctor --nnodes 2 --node-rank 1 --master-addr "127.0.0.1:$port" \
  --rendezvous-timeout 20 > "$work/n1.txt" 2>&1 || fail "node 1: $(cat "$work/n1.txt")"
wait $master || fail "node 0: $(cat "$work/n0.txt")"
for f in n0 n1; do
  [ "$(grep -c '^rendezvous: node [01] of 2: host ' "$work/$f.txt")" = 2 ] \
    || fail "$f does not list both nodes: $(cat "$work/$f.txt")"
  head -1 "$work/$f.txt" | grep -q '^rendezvous: node 0 of 2' || fail "$f: node order"
done

# The wrong --nnodes is refused by node 0, which goes on waiting for the right node.
start_master "$work/m.txt"
set +e
"$kiln" doctor --nnodes 3 --node-rank 1 --master-addr "127.0.0.1:$port" \
  --rendezvous-timeout 20 > "$work/bad.txt" 2>&1
rc=$?
set -e
[ "$rc" = 1 ] || fail "wrong --nnodes: exit $rc"
grep -q "node 0 refused node 1: --nnodes 3 differs from node 0's 2" "$work/bad.txt" \
  || fail "wrong --nnodes: $(cat "$work/bad.txt")"
"$kiln" doctor --nnodes 2 --node-rank 1 --master-addr "127.0.0.1:$port" \
  --rendezvous-timeout 20 > /dev/null || fail "the right node after a refused one"
wait $master || fail "node 0 after a refused node: $(cat "$work/m.txt")"

# Alone, node 0 gives up at its deadline.
set +e
"$kiln" doctor --nnodes 2 --node-rank 0 --master-addr 127.0.0.1:0 \
  --rendezvous-timeout 1 > "$work/alone.txt" 2>&1
rc=$?
set -e
[ "$rc" = 1 ] || fail "alone: exit $rc"
grep -q "timed out with 1 of 2 nodes joined" "$work/alone.txt" || fail "alone: $(cat "$work/alone.txt")"
echo PASS

#!/bin/sh
# Runs the embedding example (examples/embed.c) and checks what it says:
#
#   sh tests/install/check_embed.sh BINARY DB
#
# BINARY is the example built in the tree or against an installed copy;
# DB a path for its store (removed first, with SQLite's side files). The
# example checks its own answers and exits 1 on any failure; this script
# checks its exit status, the answers, the events its sink printed and
# that the store was written where asked. Prints "check_embed: ok" or
# what went wrong, and exits 0 or 1.
set -u
bin=$1
db=$2
fail() {
    echo "check_embed: $*"
    exit 1
}
mkdir -p "$(dirname "$db")" || fail "cannot make $(dirname "$db")"
rm -f "$db" "$db-wal" "$db-shm"
out=$("$bin" "$db" 2>&1)
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "$bin exited $rc"
[ -s "$db" ] || fail "no store at $db"
for line in \
    "no store: 2 + 40 = 42 (question 2 of this conversation)" \
    "store: 2 + 40 = 42 (question 1 of this conversation)" \
    "store, continued: 5 + 7 = 12 (question 2 of this conversation)" \
    "  event tool.started add" \
    "  event tool.completed add -> 42" \
    "  event tool.completed add -> 12" \
    "  event run.completed" \
    "store: 8 messages stored" \
    "embed: 6 model calls, 3 tool calls"; do
    echo "$out" | grep -Fqx -- "$line" || fail "missing line: $line"
done
[ "$(echo "$out" | grep -c '^  event run.started$')" -eq 3 ] ||
    fail "expected three run.started events"
echo "$out" | grep -Eq '^store: conversation conv_[0-9a-f]{24}$' ||
    fail "no conversation id"
[ "$(echo "$out" | tail -n 1)" = "embed: ok" ] || fail "last line not 'embed: ok'"
rm -f "$db" "$db-wal" "$db-shm"
echo "check_embed: ok"

#!/bin/sh
# Shell tests of `loom mcp`: list shows a working server's tools as
# offered (SERVER__TOOL) and a broken server's error, exit 1 when one
# fails; call prints a result (exit 0), a tool's isError on stderr
# (exit 1), and usage errors exit 2. The server is tests/mcp/fake_mcp.c,
# built beside loom.
set -u
: "${LOOM_BIN:?}"
fake="$(dirname "$LOOM_BIN")/loom-fake-mcp"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom-mcp-XXXXXX")
fails=0
checks=0
trap 'rm -rf "$tmp"' EXIT

ok() { checks=$((checks + 1)); }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }
expect_rc() { # expected actual what
    if [ "$1" -eq "$2" ]; then ok; else bad "$3: exit $2, expected $1"; fi
}
expect_grep() { # pattern file what
    if grep -q -- "$1" "$2"; then ok; else
        bad "$3: '$1' not in $2:"; sed 's/^/    /' "$2" | head -20; fi
}

cat >"$tmp/loom.yaml" <<YAML
mcp_servers:
  fake: {command: $fake, tools: [echo, fail]}
  bad: {command: /nonexistent/loom-mcp}
YAML
cfg="--config $tmp/loom.yaml"

"$LOOM_BIN" mcp list $cfg >"$tmp/out" 2>"$tmp/err"
expect_rc 1 $? "list with a broken server"
expect_grep "fake (stdio): ready, protocol 2025-11-25" "$tmp/out" "list"
expect_grep "  fake__echo  a test tool" "$tmp/out" "list"
expect_grep "  fake__fail" "$tmp/out" "list"
expect_grep "bad (stdio): failed" "$tmp/out" "list"
expect_grep "error: cannot start '/nonexistent/loom-mcp'" "$tmp/out" "list"
if grep -q "fake__hang" "$tmp/out"; then bad "allow-list ignored"; else ok; fi

"$LOOM_BIN" mcp list $cfg --json >"$tmp/out" 2>"$tmp/err"
expect_grep '"protocol_version": "2025-11-25"' "$tmp/out" "list --json"

"$LOOM_BIN" mcp call $cfg fake echo '{"x": "hi"}' >"$tmp/out" 2>"$tmp/err"
expect_rc 0 $? "call echo"
expect_grep '{"x":"hi"}' "$tmp/out" "call echo"

"$LOOM_BIN" mcp call $cfg fake fail >"$tmp/out" 2>"$tmp/err"
expect_rc 1 $? "call fail"
expect_grep "the tool failed: the disk is full" "$tmp/err" "call fail"

"$LOOM_BIN" mcp call $cfg fake echo 'not json' >"$tmp/out" 2>"$tmp/err"
expect_rc 2 $? "bad arguments"
"$LOOM_BIN" mcp call $cfg nosuch echo >"$tmp/out" 2>"$tmp/err"
expect_rc 2 $? "unknown server"
"$LOOM_BIN" mcp frob >"$tmp/out" 2>"$tmp/err"
expect_rc 2 $? "unknown subcommand"
"$LOOM_BIN" mcp --help >"$tmp/out" 2>"$tmp/err"
expect_rc 0 $? "help"

echo "test_mcp.sh: $checks checks, $fails failed"
[ "$fails" -eq 0 ]

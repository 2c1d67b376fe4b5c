#!/bin/sh
# Shell tests of `loom mcp`: list shows a working server's tools as
# offered (SERVER__TOOL) and a broken server's error, exit 1 when one
# fails; call prints a result (exit 0), a tool's isError on stderr
# (exit 1), and usage errors exit 2. `loom run` puts a server's form
# (elicitation) to the person on a terminal, one prompt per field, and
# without a terminal does not declare it can. The server is
# tests/mcp/fake_mcp.c, built beside loom; the model loom-fake-upstream.
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

# --- elicitation through loom run ---
: "${LOOM_FAKE_BIN:?}"
printf '%s' '{"loop":true,"responses":[
 {"tool_calls":[{"id":"c1","name":"fake__elicit","arguments":"{}"}]},
 {"text":["thanks"]}]}' >"$tmp/script.json"
"$LOOM_FAKE_BIN" --script "$tmp/script.json" --max-seconds 60 \
    --record "$tmp/requests.jsonl" >"$tmp/fake.out" 2>&1 &
fake_pid=$!
i=0
while ! grep -q listening "$tmp/fake.out" 2>/dev/null && [ $i -lt 200 ]; do
    i=$((i + 1)); sleep 0.05
done
port=$(sed -n 's/^listening 127.0.0.1:\([0-9]*\).*/\1/p' "$tmp/fake.out")
cat >"$tmp/form.yaml" <<YAML
providers:
  fake: {base_url: "http://127.0.0.1:$port/v1", api_key: sk-test}
mcp_servers:
  fake: {command: $fake, args: [form]}
agents:
  main: {model: fake/m, tools: [fake__elicit]}
YAML
# Piped stdin and no controlling terminal: nobody to ask.
printf 'y\nAda\n' | env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" setsid -w "$LOOM_BIN" \
    run -c "$tmp/form.yaml" -a main "who?" >"$tmp/out" 2>"$tmp/err"
expect_rc 0 $? "run without a terminal"
expect_grep "no elicitation capability" "$tmp/requests.jsonl" \
    "no terminal: the capability is not declared"
if grep -q "asks:" "$tmp/err"; then bad "asked without a terminal"; else ok; fi
# A terminal (script's pty): the form is asked field by field.
: >"$tmp/requests.jsonl"
printf 'y\nAda\n41\n' | env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" TERM=dumb \
    script -qec "'$LOOM_BIN' run -c '$tmp/form.yaml' -a main 'who?'" \
    /dev/null >"$tmp/out" 2>&1
expect_rc 0 $? "run asked on a terminal"
expect_grep "fake asks: Who are you?" "$tmp/out" "the form is shown"
expect_grep "name (string) \*:" "$tmp/out" "a required field is asked"
expect_grep "age (integer, default 30):" "$tmp/out" "a field with a default"
expect_grep 'accept.*content.*\\"age\\":41,\\"name\\":\\"Ada' \
    "$tmp/requests.jsonl" "the server gets the answer typed"
kill "$fake_pid" 2>/dev/null
wait "$fake_pid" 2>/dev/null

echo "test_mcp.sh: $checks checks, $fails failed"
[ "$fails" -eq 0 ]

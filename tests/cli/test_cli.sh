#!/bin/sh
# Shell tests of the loom command: help, version, exit codes, --json
# events, plain output, config errors, the offline demo, and Ctrl-C.
# Needs LOOM_BIN and LOOM_FAKE_BIN (set by CTest).
set -u
: "${LOOM_BIN:?}" "${LOOM_FAKE_BIN:?}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom-cli-XXXXXX")
fails=0
checks=0
fake_pid=""

cleanup() {
    [ -n "$fake_pid" ] && kill "$fake_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

ok() { checks=$((checks + 1)); }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }
expect_rc() { # expected actual what
    if [ "$1" -eq "$2" ]; then ok; else bad "$3: exit $2, expected $1"; fi
}
expect_grep() { # pattern file what
    if grep -q -- "$1" "$2"; then ok; else
        bad "$3: '$1' not in $2:"; sed 's/^/    /' "$2" | head -20; fi
}

# Starts the fake upstream with a script; sets fake_pid and base_url.
start_fake() {
    printf '%s' "$1" > "$tmp/script.json"
    rm -f "$tmp/fake.out" "$tmp/requests.jsonl"
    "$LOOM_FAKE_BIN" --script "$tmp/script.json" --max-seconds 60 \
        --record "$tmp/requests.jsonl" > "$tmp/fake.out" 2>&1 &
    fake_pid=$!
    i=0
    while ! grep -q listening "$tmp/fake.out" 2>/dev/null; do
        i=$((i + 1)); [ $i -gt 200 ] && { bad "fake did not start"; return 1; }
        sleep 0.05
    done
    port=$(sed -n 's/^listening 127.0.0.1:\([0-9]*\).*/\1/p' "$tmp/fake.out")
    base_url="http://127.0.0.1:$port/v1"
}
stop_fake() {
    [ -n "$fake_pid" ] && kill "$fake_pid" 2>/dev/null && wait "$fake_pid" 2>/dev/null
    fake_pid=""
}

# Runs loom against the fake with a clean environment.
loom_fake() {
    env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" OPENAI_API_KEY=sk-test \
        OPENAI_BASE_URL="$base_url" "$LOOM_BIN" "$@"
}

# --- help and version ---
"$LOOM_BIN" --help > "$tmp/out" 2>&1; expect_rc 0 $? "loom --help"
expect_grep "usage: loom" "$tmp/out" "loom --help"
"$LOOM_BIN" run --help > "$tmp/out" 2>&1; expect_rc 0 $? "loom run --help"
expect_grep "max-iterations" "$tmp/out" "loom run --help"
"$LOOM_BIN" config --help > "$tmp/out" 2>&1; expect_rc 0 $? "config --help"
"$LOOM_BIN" version > "$tmp/out" 2>&1; expect_rc 0 $? "loom version"
expect_grep "^loom [0-9]*\.[0-9]*\.[0-9]*" "$tmp/out" "loom version"
# The program allocates with mimalloc unless built without it
# (LOOM_ALLOCATOR from CTest): a linker that dropped the library would
# leave glibc's malloc in place silently.
if [ "${LOOM_ALLOCATOR:-}" = mimalloc ]; then
    MIMALLOC_VERBOSE=1 "$LOOM_BIN" version > "$tmp/out" 2>&1
    expect_grep "^mimalloc: process init" "$tmp/out" "loom allocates with mimalloc"
fi
"$LOOM_BIN" version --help > "$tmp/out" 2>&1; expect_rc 0 $? "version --help"
expect_grep "usage: loom version" "$tmp/out" "loom version --help"
"$LOOM_BIN" version extra > "$tmp/out" 2>&1; expect_rc 2 $? "version extra"

# --- usage errors exit 2 ---
"$LOOM_BIN" > /dev/null 2>&1; expect_rc 2 $? "no command"
"$LOOM_BIN" frobnicate > "$tmp/out" 2>&1; expect_rc 2 $? "unknown command"
expect_grep "unknown command 'frobnicate'" "$tmp/out" "unknown command"
"$LOOM_BIN" run --bogus x > "$tmp/out" 2>&1; expect_rc 2 $? "unknown option"
"$LOOM_BIN" run -n zero x > "$tmp/out" 2>&1; expect_rc 2 $? "bad -n"
"$LOOM_BIN" run < /dev/null > "$tmp/out" 2>&1; expect_rc 2 $? "no question"
"$LOOM_BIN" run --config /nonexistent.yaml hi > "$tmp/out" 2>&1
expect_rc 2 $? "missing config"

# --- config check ---
cat > "$tmp/good.yaml" <<'EOF'
providers:
  local:
    kind: openai
    base_url: http://127.0.0.1:9/v1
agents:
  helper:
    model: local/some-model
    tools: [get_time]
EOF
"$LOOM_BIN" config check "$tmp/good.yaml" > "$tmp/out" 2>&1
expect_rc 0 $? "config check good"
expect_grep "ok" "$tmp/out" "config check good"
cat > "$tmp/bad.yaml" <<'EOF'
providers:
  local:
    kind: openai
    base_url: http://127.0.0.1:9/v1
agents:
  helper:
    model: local/some-model
    max_iterations: ten
EOF
"$LOOM_BIN" config check "$tmp/bad.yaml" > "$tmp/out" 2>&1
expect_rc 2 $? "config check bad value"
expect_grep "bad.yaml:8" "$tmp/out" "config error names file and line"
expect_grep "max_iterations" "$tmp/out" "config error names the key"
sed 's/tools: \[get_time\]/tools: [get_tiem]/' "$tmp/good.yaml" > "$tmp/badtool.yaml"
"$LOOM_BIN" config check "$tmp/badtool.yaml" > "$tmp/out" 2>&1
expect_rc 2 $? "config check unknown tool"
expect_grep "unknown tool 'get_tiem'" "$tmp/out" "unknown tool named"

# Every error of a file, one per line with its line number, in the order
# read; then every unknown tool with the line of its entry.
cat > "$tmp/many.yaml" <<'EOF'
providers:
  local:
    kind: openai
    base_url: http://127.0.0.1:9/v1
    timeouts: {connect: 5}
agents:
  helper:
    model: local/some-model
    max_iterations: ten
  other:
    model: local/some-model
    parallel_tool_calls: maybe
EOF
"$LOOM_BIN" config check "$tmp/many.yaml" > "$tmp/out" 2>&1
expect_rc 2 $? "config check several errors"
if [ "$(grep -c '^loom: config: .*many.yaml:[0-9]*: ' "$tmp/out")" = 3 ] &&
    [ "$(wc -l < "$tmp/out")" -eq 3 ]; then ok; else
    bad "three errors, one line each: $(cat "$tmp/out")"; fi
expect_grep "many.yaml:5: providers.local.timeouts: unknown key 'connect'" \
    "$tmp/out" "first error with its line"
expect_grep "many.yaml:9: agents.helper.max_iterations: " "$tmp/out" \
    "second error with its line"
expect_grep "many.yaml:12: agents.other.parallel_tool_calls: " "$tmp/out" \
    "third error with its line"
cat > "$tmp/tools.yaml" <<'EOF'
providers:
  local: {base_url: "http://127.0.0.1:9/v1"}
agents:
  helper:
    model: local/some-model
    tools:
      - get_tiem
      - get_time
      - web_serch
EOF
"$LOOM_BIN" config check "$tmp/tools.yaml" > "$tmp/out" 2>&1
expect_rc 2 $? "config check unknown tools"
expect_grep "^loom: config: .*tools.yaml:7: agents.helper.tools: unknown tool 'get_tiem' (available: " \
    "$tmp/out" "unknown tool with its line"
expect_grep "^loom: config: .*tools.yaml:9: agents.helper.tools: unknown tool 'web_serch'" \
    "$tmp/out" "second unknown tool with its line"
"$LOOM_BIN" run -c "$tmp/many.yaml" "hi" > "$tmp/out" 2>&1
expect_rc 2 $? "run with several config errors"
expect_grep "many.yaml:12: agents.other.parallel_tool_calls: " "$tmp/out" \
    "loom run prints every config error"

# --- an agent naming memory tools: they exist only in loom serve ---
start_fake '{"responses":[{"text":["remembered nothing"]}]}'
cat > "$tmp/mem.yaml" <<EOF
providers:
  fake: {base_url: "$base_url", api_key: sk-test}
agents:
  keeper: {model: fake/m, tools: [get_time, memory_store, memory_retrieve]}
EOF
"$LOOM_BIN" config check "$tmp/mem.yaml" > "$tmp/out" 2>&1
expect_rc 0 $? "config check accepts memory tools"
env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" "$LOOM_BIN" run -c "$tmp/mem.yaml" \
    -a keeper "hi" > "$tmp/out" 2> "$tmp/err"
expect_rc 0 $? "run with an agent naming memory tools"
expect_grep "remembered nothing" "$tmp/out" "memory agent answers"
expect_grep '"get_time"' "$tmp/requests.jsonl" "the agent's other tools offered"
if grep -q memory_store "$tmp/requests.jsonl"; then
    bad "memory tools offered without a store"; else ok; fi
stop_fake

# --- a run with a tool, plain mode ---
start_fake '{"responses":[
 {"tool_calls":[{"id":"c1","name":"get_time","arguments":"{\"timezone\":\"Asia/Tokyo\"}"}]},
 {"text":["It is ","late ","in Tokyo."],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}]}'
loom_fake run "time in Tokyo?" > "$tmp/out" 2> "$tmp/err"
expect_rc 0 $? "plain run"
expect_grep "It is late in Tokyo." "$tmp/out" "answer on stdout"
expect_grep "get_time" "$tmp/err" "tool shown on stderr"
if grep -q get_time "$tmp/out"; then bad "tool lines leaked to stdout"; else ok; fi
expect_grep '"model":"gpt-4o-mini"' "$tmp/requests.jsonl" "default model sent"
expect_grep '"authorization":"Bearer sk-test"' "$tmp/requests.jsonl" "key sent"
stop_fake

# --- --json events ---
start_fake '{"responses":[
 {"tool_calls":[{"id":"c1","name":"get_time","arguments":"{}"}]},
 {"text":["done"]}]}'
loom_fake run --json -m openai/gpt-4.1-nano "time?" > "$tmp/out" 2> "$tmp/err"
expect_rc 0 $? "json run"
for t in run.started tool_calls tool.started tool.completed message.delta run.completed; do
    expect_grep "\"type\":\"$t\"" "$tmp/out" "--json has $t"
done
expect_grep '"seq":1,' "$tmp/out" "--json seq"
expect_grep '"index":1' "$tmp/out" "--json index"
expect_grep '"model":"gpt-4.1-nano"' "$tmp/requests.jsonl" "--model sent"
# Every line is one JSON object.
if awk '!/^\{.*\}$/ { exit 1 }' "$tmp/out"; then ok; else bad "--json lines"; fi
stop_fake

# --- sub-agents: nested events in --json, indented lines in plain mode ---
start_fake '{"rules":[
 {"match":{"system":"You are main"},"loop":true,"responses":[
  {"tool_calls":[{"id":"c1","name":"helper","arguments":"{\"task\":\"dig\"}"}]},
  {"text":["main done"]}]},
 {"match":{"system":"You help"},"loop":true,"responses":[
  {"text":["helped"]}]}]}'
cat > "$tmp/sub.yaml" <<EOF
providers:
  fake: {base_url: "$base_url", api_key: sk-test}
agents:
  main: {model: fake/m, system_prompt: You are main., tools: [], sub_agents: [helper]}
  helper: {model: fake/m, system_prompt: You help., tools: []}
EOF
env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" "$LOOM_BIN" run -c "$tmp/sub.yaml" -a main \
    --json "go" > "$tmp/out" 2> "$tmp/err"
expect_rc 0 $? "json run with a sub-agent"
expect_grep '"type":"run.started".*"parent_call_id":"c1","agent":"helper","depth":1' \
    "$tmp/out" "--json nests the child's events"
expect_grep '"type":"tool.delta".*"call_id":"c1".*"delta":"helped"' "$tmp/out" \
    "--json streams the child's answer to the call"
# The last line is the top run's own end.
if tail -n 1 "$tmp/out" | grep -q '"type":"run.completed"' &&
    ! tail -n 1 "$tmp/out" | grep -q parent_run_id; then ok; else
    bad "--json ends with the top run.completed"; fi
env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" "$LOOM_BIN" run -c "$tmp/sub.yaml" -a main \
    "go" > "$tmp/out" 2> "$tmp/err"
expect_rc 0 $? "plain run with a sub-agent"
expect_grep "^main done" "$tmp/out" "the top answer on stdout"
if grep -q helped "$tmp/out"; then bad "child text leaked to stdout"; else ok; fi
expect_grep "^  \[helper\] = answered: helped" "$tmp/err" "child's end indented"
stop_fake

# --- model names: one rule (docs/routing.md#model-names) ---
# A bare name goes to the default model's provider; agent/<name> runs it.
start_fake '{"loop":true,"responses":[{"text":["bare ok"]}]}'
loom_fake run -m gpt-4o "hi" > "$tmp/out" 2> "$tmp/err"
expect_rc 0 $? "run -m with a bare name"
expect_grep "bare ok" "$tmp/out" "bare name answers"
expect_grep '"model":"gpt-4o"' "$tmp/requests.jsonl" "bare name sent upstream"
cat > "$tmp/names.yaml" <<EOF
providers:
  fake: {base_url: "$base_url", api_key: sk-test}
agents:
  terse: {model: fake/m, system_prompt: Answer in one word., tools: []}
EOF
env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" "$LOOM_BIN" run -c "$tmp/names.yaml" \
    -m agent/terse "hi" > "$tmp/out" 2> "$tmp/err"
expect_rc 0 $? "run -m agent/<name>"
expect_grep "Answer in one word." "$tmp/requests.jsonl" "agent's prompt sent"
env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" "$LOOM_BIN" run -c "$tmp/names.yaml" \
    -m nope/m "hi" > "$tmp/out" 2> "$tmp/err"
expect_rc 2 $? "run -m with an unknown provider"
expect_grep "provider 'nope' is not defined" "$tmp/err" "unknown provider named"
stop_fake

# --- --max-iterations: the last call forbids tools and still answers ---
start_fake '{"responses":[
 {"tool_calls":[{"id":"c1","name":"get_time","arguments":"{}"}]},
 {"text":["final"]}]}'
loom_fake run -n 2 "loop" > "$tmp/out" 2> "$tmp/err"
expect_rc 0 $? "max-iterations run"
expect_grep "final" "$tmp/out" "answer at the limit"
if tail -n 1 "$tmp/requests.jsonl" | grep -q '"tool_choice": *"none"'; then
    ok; else bad "the last permitted call allows tool calls"; fi
stop_fake

# --- a failed run exits 1 with the upstream message ---
start_fake '{"responses":[{"status":401,"error":{"message":"Incorrect API key provided","type":"invalid_request_error"}}]}'
loom_fake run "hi" > "$tmp/out" 2> "$tmp/err"
expect_rc 1 $? "401 run"
expect_grep "Incorrect API key provided" "$tmp/err" "upstream message shown"
stop_fake

# --- Ctrl-C cancels cleanly: exit 130 ---
start_fake '{"responses":[{"text":["thinking"],"hang":true,"hang_after_chunks":2}]}'
# Not through loom_fake: $! must be loom's own pid (env execs it).
env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" OPENAI_API_KEY=sk-test \
    OPENAI_BASE_URL="$base_url" "$LOOM_BIN" run "hang" > "$tmp/out" 2> "$tmp/err" &
loom_pid=$!
i=0
while ! grep -q thinking "$tmp/out" 2>/dev/null && [ $i -lt 200 ]; do
    i=$((i + 1)); sleep 0.05
done
kill -INT $loom_pid
wait $loom_pid
expect_rc 130 $? "Ctrl-C"
expect_grep "cancelled" "$tmp/err" "Ctrl-C message"
# the answer's line is ended
expect_last_byte_nl() { # file what
    if [ "$(tail -c 1 "$1" | od -An -c | tr -d ' ')" = '\n' ]; then ok
    else bad "$2: the output does not end with a newline"; fi
}
expect_last_byte_nl "$tmp/out" "Ctrl-C"
stop_fake

# --- approval: --approve-all, no terminal, and a terminal (script's pty) ---
start_fake '{"loop":true,"responses":[
 {"tool_calls":[{"id":"c1","name":"get_time","arguments":"{}"}]},
 {"text":["done"]}]}'
cat > "$tmp/approve.yaml" <<EOF
providers:
  fake: {base_url: "$base_url", api_key: sk-test}
tools:
  get_time: {approval: required}
agents:
  careful: {model: fake/m, tools: [get_time]}
EOF
loom_approve() { # extra args...: loom run without a controlling terminal
    env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" setsid -w "$LOOM_BIN" run \
        -c "$tmp/approve.yaml" -a careful "$@" < /dev/null
}
loom_approve --approve-all --json "time?" > "$tmp/out" 2> "$tmp/err"
expect_rc 0 $? "run with --approve-all"
expect_grep '"type":"approval.required"' "$tmp/out" "approval.required event"
expect_grep '"type":"tool.completed"' "$tmp/out" "approved call runs"
expect_grep "approved get_time" "$tmp/err" "approval said on stderr"
: > "$tmp/requests.jsonl"
loom_approve "time?" > "$tmp/out" 2> "$tmp/err"
expect_rc 0 $? "run denied without a terminal"
expect_grep "no terminal to ask" "$tmp/err" "denial said on stderr"
expect_grep "the user denied this call: no terminal to ask for approval" \
    "$tmp/requests.jsonl" "the model reads the denial"
: > "$tmp/requests.jsonl"
printf 'n\nnot today\n' | env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" TERM=dumb \
    script -qec "'$LOOM_BIN' run -c '$tmp/approve.yaml' -a careful 'time?'" \
    /dev/null > "$tmp/out" 2>&1
expect_rc 0 $? "run asked on a terminal"
expect_grep "approve get_time {}? \[y/N\]" "$tmp/out" "the terminal is asked"
expect_grep "the user denied this call: not today" "$tmp/requests.jsonl" \
    "the model reads the reason typed"
stop_fake

# --- approval of a sub-agent's call: asked with its agent's name ---
start_fake '{"rules":[
 {"match":{"system":"You are main"},"loop":true,"responses":[
  {"tool_calls":[{"id":"c1","name":"helper","arguments":"{\"task\":\"dig\"}"}]},
  {"text":["main done"]}]},
 {"match":{"system":"You help"},"loop":true,"responses":[
  {"tool_calls":[{"id":"t1","name":"get_time","arguments":"{}"}]},
  {"text":["helped"]}]}]}'
cat > "$tmp/subapprove.yaml" <<EOF
providers:
  fake: {base_url: "$base_url", api_key: sk-test}
tools:
  get_time: {approval: required}
agents:
  main: {model: fake/m, system_prompt: You are main., tools: [], sub_agents: [helper]}
  helper: {model: fake/m, system_prompt: You help., tools: [get_time]}
EOF
loom_subapprove() { # extra args...: loom run without a controlling terminal
    env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" setsid -w "$LOOM_BIN" run \
        -c "$tmp/subapprove.yaml" -a main "$@" < /dev/null
}
loom_subapprove --approve-all --json "go" > "$tmp/out" 2> "$tmp/err"
expect_rc 0 $? "sub-agent run with --approve-all"
expect_grep '"type":"approval.required".*"agent":"helper"' "$tmp/out" \
    "the child's approval.required, nested"
expect_grep '"type":"tool.completed".*"agent":"helper".*"name":"get_time"' \
    "$tmp/out" "the child's approved call runs"
expect_grep "^  \[helper\] approved get_time" "$tmp/err" \
    "--approve-all covers the child's call"
: > "$tmp/requests.jsonl"
loom_subapprove "go" > "$tmp/out" 2> "$tmp/err"
expect_rc 0 $? "sub-agent run denied without a terminal"
expect_grep "^  \[helper\] ! get_time needs approval" "$tmp/err" \
    "the child's denial said on stderr"
expect_grep "the user denied this call: no terminal to ask for approval" \
    "$tmp/requests.jsonl" "the child's model reads the denial"
: > "$tmp/requests.jsonl"
printf 'n\nnot today\n' | env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" TERM=dumb \
    script -qec "'$LOOM_BIN' run -c '$tmp/subapprove.yaml' -a main 'go'" \
    /dev/null > "$tmp/out" 2>&1
expect_rc 0 $? "sub-agent run asked on a terminal"
expect_grep "\[helper\] approve get_time {}? \[y/N\]" "$tmp/out" \
    "the terminal is asked about the child's call"
expect_grep "the user denied this call: not today" "$tmp/requests.jsonl" \
    "the child's model reads the reason typed"
expect_grep "main done" "$tmp/out" "the run goes on after the child's answer"
stop_fake

# --- offline demo without a key ---
env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" LOOM_FAKE_UPSTREAM="$LOOM_FAKE_BIN" \
    "$LOOM_BIN" run "hello" > "$tmp/out" 2> "$tmp/err"
expect_rc 0 $? "offline demo"
expect_grep "OFFLINE DEMO" "$tmp/err" "offline demo says so"
expect_grep "offline demo" "$tmp/out" "offline demo answers"
expect_grep "get_time" "$tmp/err" "offline demo runs a tool"

echo "cli: $checks checks, $fails failed"
[ "$fails" -eq 0 ]

#!/bin/sh
# Shell tests of `loom research` against the fake upstream, which also
# stands in for SearXNG (its plain responses answer the search GETs):
# usage errors, the progress lines and the checked report with its
# Sources list, --json, --out, a clarifying question (unanswered without
# a terminal, answered on one) and Ctrl-C cancelling the whole tree.
# Needs LOOM_BIN and LOOM_FAKE_BIN (set by CTest).
set -u
: "${LOOM_BIN:?}" "${LOOM_FAKE_BIN:?}"
. "$(dirname "$0")/research_lib.sh"

# The supervisor's phases (later ones first: their requests hold the
# earlier notes too), a researcher on alpha that searches, one on beta
# that fails, and the search answers.
SEARCH='{"body":"{\"results\":[{\"url\":\"https://alpha.example.org/page\",\"title\":\"About alpha\",\"content\":\"Facts.\"}]}"}'
SCRIPT='{"rules":[
 {"match":{"system":"Write the final report now"},"loop":true,"responses":[{"text":["Alpha holds [1]; also [7]."]}]},
 {"match":{"system":"Research cycle 2 of"},"loop":true,"responses":[{"tool_calls":[{"name":"generate_report","arguments":"{}"}]}]},
 {"match":{"system":"Research cycle 1 of"},"loop":true,"responses":[{"tool_calls":[
   {"id":"ra","name":"research_agent","arguments":"{\"task\":\"alpha\"}"},
   {"id":"rb","name":"research_agent","arguments":"{\"task\":\"beta\"}"}],"interleave":true}]},
 {"match":{"system":"Write the research plan"},"loop":true,"responses":[{"text":["1. Alpha\n2. Beta"],
   "usage":{"prompt_tokens":100000,"completion_tokens":50000,"total_tokens":150000}}]},
 {"match":{"system":"too ambiguous"},"loop":true,"responses":[{"text":["Which alpha?"]}]},
 {"match":{"system":"You are a researcher","first_user":"alpha"},"loop":true,"responses":[
   {"tool_calls":[{"name":"web_search","arguments":"{\"query\":\"alpha\"}"}]},
   {"text":["Alpha is so [1]."]}]},
 {"match":{"first_user":"beta"},"loop":true,"responses":[{"status":500,"error":{"message":"beta broke"}}]}],
 "loop":true,"responses":['"$SEARCH"']}'

# --- usage errors ---
"$LOOM_BIN" research --help > "$tmp/out" 2>&1; expect_rc 0 $? "research --help"
expect_grep "no-clarify" "$tmp/out" "research --help"
"$LOOM_BIN" --help > "$tmp/out" 2>&1
expect_grep "research \"question\"" "$tmp/out" "loom --help lists research"
"$LOOM_BIN" research --bogus x > "$tmp/out" 2>&1; expect_rc 2 $? "unknown option"
"$LOOM_BIN" research < /dev/null > "$tmp/out" 2>&1; expect_rc 2 $? "no question"
env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" "$LOOM_BIN" research "q" > "$tmp/out" 2>&1
expect_rc 2 $? "no provider"
expect_grep "no model provider" "$tmp/out" "no provider said"

start_fake "$SCRIPT"
loom_research -a nope "q" > "$tmp/out" 2> "$tmp/err"
expect_rc 2 $? "unknown agent"
expect_grep "no agent named 'nope'" "$tmp/err" "unknown agent named"
loom_research -a plain "q" > "$tmp/out" 2> "$tmp/err"
expect_rc 2 $? "not a research agent"
expect_grep "'plain' is not a research agent" "$tmp/err" "not a research agent said"

# --- plain: progress on stderr, the checked report on stdout ---
loom_research --no-clarify "Compare alpha and beta" > "$tmp/out" 2> "$tmp/err"
expect_rc 0 $? "plain research"
expect_grep "^plan:" "$tmp/err" "plan shown"
expect_grep "^1. Alpha" "$tmp/err" "plan text shown"
expect_grep '^cycle 1/8: 150000 tokens, \$0.2000 so far' "$tmp/err" \
    "cycle with tokens and cost"
expect_grep "^cycle 1: 2 researchers in parallel" "$tmp/err" "branch shown"
expect_grep "^researcher 1: started: alpha" "$tmp/err" "researcher task"
expect_grep "^researcher 1: done in [0-9.]* s, 1 source$" "$tmp/err" \
    "researcher status, elapsed and sources"
expect_grep "^researcher 2: failed in [0-9.]* s: .*beta broke" "$tmp/err" \
    "failed researcher"
expect_grep "^report (requested): 2 cycles, 2 researchers (1 failed), 1 source cited; 150000 tokens" \
    "$tmp/err" "summary"
expect_grep "^Alpha holds \[1\]; also\.$" "$tmp/out" "report on stdout"
expect_no_grep "\[7\]" "$tmp/out" "a marker naming no source is removed"
expect_grep "A researcher failed on \"beta\"" "$tmp/out" "the notes"
expect_grep "^## Sources" "$tmp/out" "Sources list"
expect_grep "^\[1\] About alpha - https://alpha.example.org/page" "$tmp/out" \
    "the cited source"
expect_no_grep "^researcher\|^cycle\|^plan:" "$tmp/out" "no progress on stdout"
expect_no_grep "too ambiguous" "$tmp/requests.jsonl" "--no-clarify asks nothing"

# --- --json: the events; --out: the report in a file ---
loom_research --no-clarify --json -o "$tmp/report.md" "Compare" \
    > "$tmp/out" 2> "$tmp/err"
expect_rc 0 $? "json research"
for t in research.plan research.cycle research.branch citation run.completed; do
    expect_grep "\"type\":\"$t\"" "$tmp/out" "--json has $t"
done
expect_grep '"report_reason":"requested"' "$tmp/out" "--json report_reason"
if awk '!/^\{.*\}$/ { exit 1 }' "$tmp/out"; then ok; else bad "--json lines"; fi
expect_grep "^\[1\] About alpha - https://alpha.example.org/page" \
    "$tmp/report.md" "--out writes the report"
loom_research --no-clarify --out "$tmp/report2.md" "Compare" \
    > "$tmp/out" 2> "$tmp/err"
expect_rc 0 $? "research --out"
expect_grep "^## Sources" "$tmp/report2.md" "--out has the Sources list"
if [ -s "$tmp/out" ]; then bad "--out also printed the report"; else ok; fi
expect_grep "report written to" "$tmp/err" "--out said"

# --- a clarifying question: no terminal to answer it, then a terminal ---
loom_research "Tell me about alpha" < /dev/null > "$tmp/out" 2> "$tmp/err"
expect_rc 1 $? "unanswered question"
expect_grep "clarifying question needs an answer: Which alpha?" "$tmp/err" \
    "the question said"
expect_grep "no-clarify" "$tmp/err" "what to do said"
: > "$tmp/requests.jsonl"
printf 'The letter\n' | env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" TERM=dumb \
    script -qec "'$LOOM_BIN' research -c '$tmp/r.yaml' 'Tell me about alpha'" \
    /dev/null > "$tmp/out" 2>&1
expect_rc 0 $? "question answered on a terminal"
expect_grep "Which alpha?" "$tmp/out" "the terminal is asked"
expect_grep "## Sources" "$tmp/out" "the research resumes"
expect_grep "The letter" "$tmp/requests.jsonl" "the answer goes to the model"
stop_fake

# --- Ctrl-C cancels the whole tree: exit 130 while a researcher hangs ---
start_fake '{"rules":[
 {"match":{"system":"Research cycle 1 of"},"responses":[{"tool_calls":[
   {"id":"rs","name":"research_agent","arguments":"{\"task\":\"slow\"}"}]}]},
 {"match":{"system":"Write the research plan"},"responses":[{"text":["1. Slow"]}]},
 {"match":{"first_user":"slow"},"responses":[{"text":["reading"],"hang":true,"hang_after_chunks":1}]}]}'
env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" "$LOOM_BIN" research -c "$tmp/r.yaml" \
    --no-clarify "slow one" > "$tmp/out" 2> "$tmp/err" &
loom_pid=$!
i=0
while ! grep -q '"hanging": *1' "$tmp/stats" 2>/dev/null && [ $i -lt 400 ]; do
    i=$((i + 1)); sleep 0.05
    curl -s "http://127.0.0.1:$port/_fake/stats" > "$tmp/stats" 2>/dev/null
done
expect_grep "researcher 1: started: slow" "$tmp/err" "the researcher runs"
kill -INT $loom_pid
wait $loom_pid
expect_rc 130 $? "Ctrl-C"
expect_grep "cancelled" "$tmp/err" "Ctrl-C said"
# loom ended while the fake still hangs on the researcher's request: the
# cancel reached the researcher, not only the supervisor.
if kill -0 "$fake_pid" 2>/dev/null; then ok; else
    bad "loom waited for the fake to end"; fi
expect_no_grep "Write the final report" "$tmp/requests.jsonl" \
    "no report after a cancel"
stop_fake

echo "research cli: $checks checks, $fails failed"
[ "$fails" -eq 0 ]

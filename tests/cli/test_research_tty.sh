#!/bin/sh
# `loom research` on a real terminal: a tmux pane (Debian's tmux,
# scripts/deps.sh installs it) runs it against the fake upstream. The live
# view is redrawn in place on stderr (one status line left on the screen,
# not one per redraw) and shows the plan, the cycle, each researcher with
# its status and sources, and the tokens and cost; the report follows on
# stdout. A researcher task and a report holding "\x1b[2J" never reach
# the terminal raw (every byte the pane got is logged with pipe-pane).
# Ctrl-C sent to the pane in the middle of a researcher cancels the whole
# tree: exit 130, said, the last frame saying "cancelled".
# Needs LOOM_BIN and LOOM_FAKE_BIN (set by CTest).
set -u
: "${LOOM_BIN:?}" "${LOOM_FAKE_BIN:?}"
. "$(dirname "$0")/research_lib.sh"

if ! command -v tmux >/dev/null 2>&1; then
    echo "FAIL: tmux is not installed (sh scripts/deps.sh installs it)"
    exit 1
fi
sock="loom-research-tty-$$"
T() { tmux -L "$sock" -f /dev/null "$@"; }
kill_tmux() { T kill-server 2>/dev/null; }
cleanup_more=kill_tmux
# The tmux server outlives this shell if it is killed (SIGKILL: no
# cleanup): a window of its own ends the server once the shell is gone.
guard_tmux() {
    T new-window -d -n guard \
        "tail --pid=$$ -f /dev/null; tmux -L '$sock' kill-server"
}

# Runs `loom research --no-clarify "$2"` in the tmux window $1 (100x40),
# everything the pane receives logged to $tmp/$1.raw; the command's exit
# status is printed in the pane ("exit N") and the channel $1-done
# signalled when it ends. Returns once loom is started.
start_pane() {
    # The shell survives the Ctrl-C sent to the pane (a trap, not an
    # ignore: loom gets SIGINT as usual) to say how loom ended.
    cat > "$tmp/$1.sh" <<EOF
trap : INT
tmux -L "$sock" wait-for "$1-go"
env -i \${TSAN_OPTIONS:+"TSAN_OPTIONS=\$TSAN_OPTIONS"} PATH="\$PATH" HOME="$tmp" TERM="\$TERM" "$LOOM_BIN" research \
    -c "$tmp/r.yaml" --no-clarify "$2"
echo "exit \$?"
tmux -L "$sock" wait-for -S "$1-done"
EOF
    if T has-session 2>/dev/null; then
        T new-window -d -n "$1" "sh '$tmp/$1.sh'"
    else
        T new-session -d -s main -n "$1" -x 100 -y 40 "sh '$tmp/$1.sh'"
        guard_tmux
    fi
    T set-option -w -t "main:$1" remain-on-exit on
    T pipe-pane -t "main:$1" -o "cat > '$tmp/$1.raw'"
    T wait-for -S "$1-go"
}
# Waits (at most 120 s) for the pane's command to end; its screen and
# history then in $tmp/$1.screen.
wait_pane() {
    if timeout 120 tmux -L "$sock" -f /dev/null wait-for "$1-done"; then ok
    else bad "$1: loom did not end"; fi
    T capture-pane -p -S - -t "main:$1" > "$tmp/$1.screen"
}
ESC=$(printf '\033')

# --- a whole run: the view, redrawn in place, then the report ---
SEARCH='{"body":"{\"results\":[{\"url\":\"https://alpha.example.org/page\",\"title\":\"About alpha\",\"content\":\"Facts.\"}]}"}'
start_fake '{"rules":[
 {"match":{"system":"Write the final report now"},"loop":true,"responses":[{"text":["Alpha holds [1].\u001b[2J"]}]},
 {"match":{"system":"Research cycle 2 of"},"loop":true,"responses":[{"tool_calls":[{"name":"generate_report","arguments":"{}"}]}]},
 {"match":{"system":"Research cycle 1 of"},"loop":true,"responses":[{"tool_calls":[
   {"id":"ra","name":"research_agent","arguments":"{\"task\":\"alpha\"}"},
   {"id":"rb","name":"research_agent","arguments":"{\"task\":\"beta\"}"},
   {"id":"rc","name":"research_agent","arguments":"{\"task\":\"evil\\u001b[2Jtask\"}"}],"interleave":true}]},
 {"match":{"system":"Write the research plan"},"loop":true,"responses":[{"text":["1. Alpha\n2. Beta"],
   "usage":{"prompt_tokens":100000,"completion_tokens":50000,"total_tokens":150000}}]},
 {"match":{"system":"You are a researcher","first_user":"alpha"},"loop":true,"responses":[
   {"tool_calls":[{"name":"web_search","arguments":"{\"query\":\"alpha\"}"}]},
   {"text":["Alpha is so [1]."]}]},
 {"match":{"first_user":"beta"},"loop":true,"responses":[{"status":500,"error":{"message":"beta broke"}}]},
 {"match":{"first_user":"evil"},"loop":true,"responses":[{"status":500,"error":{"message":"evil broke"}}]}],
 "loop":true,"responses":['"$SEARCH"']}'
start_pane whole "Compare alpha and beta"
wait_pane whole
s="$tmp/whole.screen"
expect_grep "^exit 0$" "$s" "the run ends well"
expect_grep '^research: done, 3 researchers (1 done, 2 failed), 150000 tokens, \$0.2000' \
    "$s" "the status line: researchers, tokens, cost"
if [ "$(grep -c '^research: ' "$s")" -eq 1 ]; then ok; else
    bad "the view is not redrawn in place:"; sed 's/^/    /' "$s"; fi
expect_grep "^plan:" "$s" "the plan"
expect_grep "^  2. Beta" "$s" "the plan's lines"
expect_grep "^cycle 1/8: 3 researchers" "$s" "the cycle"
expect_grep "^  \[done\] *[0-9.]* s *1 source *1: alpha$" "$s" \
    "a researcher: status, elapsed, sources, task"
expect_grep "^  \[failed\] .* 2: beta -- agent .* failed" "$s" \
    "a failed researcher, its error"
expect_grep "3: eviltask -- " "$s" "the task, cleaned"
expect_grep "^cycle 2/8" "$s" "the second cycle"
expect_grep "^report (requested): 2 cycles, 3 researchers (2 failed)" "$s" \
    "the summary"
expect_grep "^Alpha holds \[1\]\.$" "$s" "the report, cleaned"
expect_grep "^\[1\] About alpha - https://alpha.example.org/page" "$s" \
    "the report's Sources"
expect_grep 'failed on "eviltask"' "$s" "the report's notes, cleaned"
wait_raw whole "failed on"
expect_no_grep "${ESC}\[2J" "$tmp/whole.raw" "no raw escape reaches the terminal"
expect_grep "${ESC}\[[0-9]*A" "$tmp/whole.raw" "redrawn by moving up"
expect_grep "eviltask" "$tmp/whole.raw" "the terminal got the task"
stop_fake

# --- Ctrl-C in the middle of a researcher ---
start_fake '{"rules":[
 {"match":{"system":"Research cycle 1 of"},"responses":[{"tool_calls":[
   {"id":"rs","name":"research_agent","arguments":"{\"task\":\"slow one\"}"}]}]},
 {"match":{"system":"Write the research plan"},"responses":[{"text":["1. Slow"],
   "usage":{"prompt_tokens":1000,"completion_tokens":234,"total_tokens":1234}}]},
 {"match":{"first_user":"slow one"},"responses":[{"text":["reading"],"hang":true,"hang_after_chunks":1}]}]}'
start_pane cancel "slow one"
i=0
while [ $i -lt 400 ]; do
    curl -s "http://127.0.0.1:$port/_fake/stats" > "$tmp/stats" 2>/dev/null
    T capture-pane -p -t main:cancel > "$tmp/mid.screen"
    grep -q '"hanging": *1' "$tmp/stats" && grep -q "\[running\]" \
        "$tmp/mid.screen" && break
    i=$((i + 1)); sleep 0.05
done
m="$tmp/mid.screen"
expect_grep '^research: cycle 1/8, 1 researcher (1 running), 1234 tokens, \$0.0015' \
    "$m" "mid-run: the status line"
expect_grep "^cycle 1/8: 1 researcher$" "$m" "mid-run: the cycle"
expect_grep "^  \[running\] .* 1: slow one$" "$m" "mid-run: the running researcher"
T send-keys -t main:cancel C-c
wait_pane cancel
s="$tmp/cancel.screen"
expect_grep "^exit 130$" "$s" "Ctrl-C: exit 130"
expect_grep "^loom: run cancelled$" "$s" "Ctrl-C said"
expect_grep "^research: cancelled, 1 researcher" "$s" "the last frame says so"
if [ "$(grep -c '^research: ' "$s")" -eq 1 ]; then ok; else
    bad "cancel: the view is not redrawn in place"; fi
# The fake still hangs on the researcher's request: loom did not wait for
# it, the cancel reached the researcher.
if kill -0 "$fake_pid" 2>/dev/null; then ok; else
    bad "loom waited for the fake to end"; fi
expect_no_grep "Write the final report" "$tmp/requests.jsonl" \
    "no report after a cancel"
stop_fake

echo "research tty: $checks checks, $fails failed"
[ "$fails" -eq 0 ]

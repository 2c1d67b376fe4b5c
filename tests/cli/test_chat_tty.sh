#!/bin/sh
# `loom chat` on a real terminal: a tmux pane (scripts/deps.sh installs
# tmux) runs it against the fake upstream; keys go in with send-keys and
# the screen is read with capture-pane, polled until the expected text is
# there (bounded), never slept on. A conversation of two turns (the
# second request holds the first's answer), the tool's outcome and the
# reasoning shown, an escape sequence in the answer never reaching the
# terminal raw (every byte the pane got is logged with pipe-pane);
# Ctrl-C in the middle of an answer stops it (stored as cancelled) and a
# new question is answered; /cost says the stored usage; Ctrl-D leaves,
# and --continue goes on with the same conversation; Ctrl-C at an empty
# prompt leaves; the history file keeps the lines typed. /research shows
# the research view, redrawn in place, then the report.
# Needs LOOM_BIN and LOOM_FAKE_BIN (set by CTest), and sqlite3.
set -u
: "${LOOM_BIN:?}" "${LOOM_FAKE_BIN:?}"
. "$(dirname "$0")/chat_lib.sh"

if ! command -v tmux >/dev/null 2>&1; then
    echo "FAIL: tmux is not installed (sh scripts/deps.sh installs it)"
    exit 1
fi
sock="loom-chat-tty-$$"
T() { tmux -L "$sock" -f /dev/null "$@"; }
kill_tmux() { T kill-server 2>/dev/null; }
cleanup_more=kill_tmux
# The tmux server outlives this shell if it is killed (SIGKILL: no
# cleanup): a window of its own ends the server once the shell is gone.
guard_tmux() {
    T new-window -d -n guard \
        "tail --pid=$$ -f /dev/null; tmux -L '$sock' kill-server"
}

# Runs `loom chat $2...` in the tmux window $1 (100x40), everything the
# pane receives logged to $tmp/$1.raw; the exit status is printed in the
# pane ("exit N") when it ends.
start_pane() {
    name=$1
    shift
    cat > "$tmp/$name.sh" <<EOF
trap : INT
tmux -L "$sock" wait-for "$name-go"
env -i \${TSAN_OPTIONS:+"TSAN_OPTIONS=\$TSAN_OPTIONS"} PATH="\$PATH" HOME="$tmp" TERM="\$TERM" "$LOOM_BIN" chat \
    -c "$tmp/r.yaml" --db "$tmp/chat.db" $*
echo "exit \$?"
EOF
    if T has-session 2>/dev/null; then
        T new-window -d -n "$name" "sh '$tmp/$name.sh'"
    else
        T new-session -d -s main -n "$name" -x 100 -y 40 "sh '$tmp/$name.sh'"
        guard_tmux
    fi
    T set-option -w -t "main:$name" remain-on-exit on
    T pipe-pane -t "main:$name" -o "cat > '$tmp/$name.raw'"
    T wait-for -S "$name-go"
}
# Polls window $1's screen and history (at most 20 s) until the fixed
# text $2 is on a line of it; the screen is then in $tmp/$1.screen.
# $3: what is checked.
wait_for() {
    i=0
    while [ $i -lt 400 ]; do
        T capture-pane -p -S - -t "main:$1" > "$tmp/$1.screen"
        grep -qF -- "$2" "$tmp/$1.screen" && { ok; return 0; }
        i=$((i + 1)); sleep 0.05
    done
    bad "$3: '$2' never showed:"; sed 's/^/    /' "$tmp/$1.screen" | tail -30
    return 1
}
# Polls window $1 (at most 20 s) until its last line that is not blank is
# the empty prompt: the turn has ended and the line editor reads again.
# Keys sent before that reach a turn still ending (a slow build, the
# sanitizers) instead of the prompt. $2: what is checked.
wait_prompt() {
    i=0
    while [ $i -lt 400 ]; do
        T capture-pane -p -S - -t "main:$1" > "$tmp/$1.screen"
        [ "$(grep -v '^ *$' "$tmp/$1.screen" | tail -n 1)" = ">" ] &&
            { ok; return 0; }
        i=$((i + 1)); sleep 0.05
    done
    bad "$2: the prompt never came back:"
    sed 's/^/    /' "$tmp/$1.screen" | tail -30
    return 1
}
# How many lines of window $1's screen hold the fixed text $2.
count() {
    T capture-pane -p -S - -t "main:$1" | grep -cF -- "$2"
}
ESC=$(printf '\033')

start_fake "$CHAT_SCRIPT"

# --- two turns ---
start_pane one
wait_for one "Ctrl-D to leave" "the banner"
T send-keys -t main:one "alpha question" Enter
wait_for one "Alpha answer." "turn 1 answered"
expect_grep "thinking hard" "$tmp/one.screen" "the reasoning shown"
expect_grep "^< get_time ok" "$tmp/one.screen" "the tool's outcome"
wait_raw one "Alpha answer."
expect_grep "${ESC}\[2m" "$tmp/one.raw" "the reasoning dimmed"
expect_no_grep "${ESC}\[2J" "$tmp/one.raw" "no raw escape reaches the terminal"
T send-keys -t main:one "beta question" Enter
wait_for one "Beta answer, after alpha." "turn 2: the history went with it"
conv=$(last_conversation)

# --- Ctrl-C in the middle of an answer, then a new question ---
T send-keys -t main:one "slow question" Enter
wait_for one "Slow start" "the slow answer starts"
i=0
while [ $i -lt 400 ]; do
    curl -s "http://127.0.0.1:$port/_fake/stats" > "$tmp/stats" 2>/dev/null
    grep -q '"hanging": *1' "$tmp/stats" && break
    i=$((i + 1)); sleep 0.05
done
T send-keys -t main:one C-c
wait_for one "[stopped]" "Ctrl-C stops the answer"
T send-keys -t main:one "gamma question" Enter
wait_for one "Gamma answer." "a new question after Ctrl-C"
if [ "$(sqlite3 "$tmp/chat.db" "SELECT count(*) FROM messages WHERE
        conversation_id = '$conv' AND status = 'cancelled'")" -ge 1 ]; then ok
else bad "the stopped answer is not stored as cancelled"; fi
if kill -0 "$fake_pid" 2>/dev/null; then ok; else
    bad "the fake ended: loom waited for the hung answer"; fi

# --- /cost, then Ctrl-D ---
T send-keys -t main:one "/cost" Enter
wait_for one "$conv: " "/cost answered"
expected_cost "$conv" > "$tmp/cost"
wait_for one "$(cat "$tmp/cost")" "/cost: the stored usage, summed"
T send-keys -t main:one "typed then dropped" C-c
T send-keys -t main:one C-d
wait_for one "exit 0" "Ctrl-D leaves (Ctrl-C only dropped a typed line)"
expect_grep "loom chat -C $conv" "$tmp/one.screen" "how to come back"
expect_grep "^alpha\\\\040question$" "$tmp/.local/state/loom/chat_history" \
    "the history file"
expect_no_grep "typed" "$tmp/.local/state/loom/chat_history" \
    "a dropped line is not in the history"

# --- --continue: the same conversation ---
start_pane two --continue
wait_for two "conversation $conv \"Alpha chat\"" "--continue: the last one"
T send-keys -t main:two "delta question" Enter
wait_for two "Delta sees gamma." "--continue: its history is there"
wait_prompt two "the turn ends"
T send-keys -t main:two C-c
wait_for two "exit 0" "Ctrl-C at an empty prompt leaves"
if [ "$(count two "Delta sees gamma.")" -eq 1 ]; then ok; else
    bad "the answer shown more than once"; fi
stop_fake

# --- /research: the research view, then the report ---
start_fake '{"rules":[
 {"match":{"system":"Write the final report now"},"loop":true,"responses":[{"text":["Alpha holds [1]."]}]},
 {"match":{"system":"Research cycle 2 of"},"loop":true,"responses":[{"tool_calls":[{"name":"generate_report","arguments":"{}"}]}]},
 {"match":{"system":"Research cycle 1 of"},"loop":true,"responses":[{"tool_calls":[
   {"id":"ra","name":"research_agent","arguments":"{\"task\":\"alpha\"}"}]}]},
 {"match":{"system":"Write the research plan"},"loop":true,"responses":[{"text":["1. Alpha"],
   "usage":{"prompt_tokens":1000,"completion_tokens":234,"total_tokens":1234}}]},
 {"match":{"system":"Write a short title"},"loop":true,"responses":[{"text":["Alpha research"]}]},
 {"match":{"first_user":"alpha"},"loop":true,"responses":[{"text":["Alpha is so."]}]}]}'
start_pane three
wait_for three "Ctrl-D to leave" "the banner"
T send-keys -t main:three "/research Compare alpha" Enter
wait_for three "Alpha holds [1]." "/research: the report"
expect_grep "^research: done, 1 researcher (1 done), 1234 tokens" \
    "$tmp/three.screen" "/research: the view's status line"
if [ "$(grep -c '^research: ' "$tmp/three.screen")" -eq 1 ]; then ok; else
    bad "/research: the view is not redrawn in place"; fi
T send-keys -t main:three "/exit" Enter
wait_for three "exit 0" "/exit leaves"
stop_fake

echo "chat tty: $checks checks, $fails failed"
[ "$fails" -eq 0 ]

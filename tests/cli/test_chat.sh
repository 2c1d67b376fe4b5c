#!/bin/sh
# `loom chat` without a terminal, and `loom conversations`: lines piped in
# are messages, each answer comes out on stdout and nothing else (no
# prompt, spinner or color); the conversation is stored (the second turn's
# request holds the first turn's answer), titled, listed and searched;
# --continue and -C ID go on with it, an unknown id fails; /cost says the
# stored usage; a bad option is a usage error.
# Needs LOOM_BIN and LOOM_FAKE_BIN (set by CTest), and sqlite3.
set -u
: "${LOOM_BIN:?}" "${LOOM_FAKE_BIN:?}"
. "$(dirname "$0")/chat_lib.sh"

start_fake "$CHAT_SCRIPT"

# --- two turns, piped ---
printf 'alpha question\nbeta question\n' | loom_chat > "$tmp/out" 2> "$tmp/err"
expect_rc 0 $? "piped chat"
printf 'Alpha answer.\033[2J\nBeta answer, after alpha.\n' > "$tmp/want"
if cmp -s "$tmp/want" "$tmp/out"; then ok; else
    bad "piped: stdout is the answers alone:"; od -c "$tmp/out" | head; fi
expect_grep "^< get_time ok" "$tmp/err" "the tool's outcome on stderr"
expect_no_grep "NO HISTORY" "$tmp/out" "the second turn had the first's history"
conv=$(last_conversation)
case "$conv" in conv_*) ok ;; *) bad "no conversation stored: '$conv'" ;; esac

# --- loom conversations ---
lc() { env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" "$LOOM_BIN" conversations --db "$tmp/chat.db" "$@"; }
lc > "$tmp/list"
expect_rc 0 $? "loom conversations"
expect_grep "^ID  *UPDATED  *MESSAGES  *TITLE$" "$tmp/list" "the header"
expect_grep "^$conv  [0-9-]* [0-9:]*  *[0-9][0-9]*  Alpha chat$" "$tmp/list" \
    "a row: id, updated, messages, title"
lc --json > "$tmp/list.json"
if [ "$(jq -r '.data[0].id + " " + .data[0].title' "$tmp/list.json")" = "$conv Alpha chat" ]; then ok; else
    bad "--json:"; cat "$tmp/list.json"; fi
lc --search "ALPHA" --json > "$tmp/found.json"
expect_grep "\"$conv\"" "$tmp/found.json" "--search finds by title, any case"
lc --search "zebra" --json > "$tmp/none.json"
if [ "$(jq '.data | length' "$tmp/none.json")" -eq 0 ]; then ok; else
    bad "--search zebra found something"; fi
lc --limit 0 > /dev/null 2>&1
expect_rc 2 $? "--limit 0"

# --- --continue and -C: the same conversation; /cost ---
printf 'gamma question\n/cost\n' | loom_chat --continue > "$tmp/out2" 2> "$tmp/err2"
expect_rc 0 $? "--continue"
expect_grep "^Gamma answer\.$" "$tmp/out2" "--continue: answered"
expected_cost "$conv" > "$tmp/cost"
if grep -qxF "$(cat "$tmp/cost")" "$tmp/out2"; then ok; else
    bad "/cost is not the stored usage: $(cat "$tmp/cost")"; cat "$tmp/out2"; fi
echo "delta question" | loom_chat -C "$conv" > "$tmp/out3" 2>&1
expect_rc 0 $? "-C ID"
expect_grep "^Delta sees gamma\.$" "$tmp/out3" "-C ID: the history is there"
if [ "$(sqlite3 "$tmp/chat.db" "SELECT count(*) FROM conversations")" -eq 1 ]; then ok; else
    bad "one conversation expected"; fi
echo "hello" | loom_chat -C conv_000000000000000000000000 > "$tmp/out4" 2>&1
expect_rc 1 $? "-C unknown"
expect_grep "no conversation 'conv_000000000000000000000000'" "$tmp/out4" \
    "-C unknown: said"

# --- commands and errors ---
printf '/new\n/frob\n/model\n' | loom_chat > "$tmp/out5" 2> "$tmp/err5"
expect_rc 0 $? "commands"
expect_grep "^new conversation$" "$tmp/out5" "/new"
expect_grep "^agent: (default), model openai/gpt-4o-mini$" "$tmp/out5" "/model"
expect_grep "unknown command /frob" "$tmp/err5" "an unknown command"
loom_chat --bogus < /dev/null > /dev/null 2>&1
expect_rc 2 $? "a bad option"
loom_chat --continue -C x < /dev/null > /dev/null 2>&1
expect_rc 2 $? "--continue with -C"
"$LOOM_BIN" chat --help | grep -q -- "--continue"
expect_rc 0 $? "--help"

echo "chat: $checks checks, $fails failed"
[ "$fails" -eq 0 ]

# Shared by the shell tests of `loom research` (sourced, not run): a
# temporary directory removed on exit, check counters and assertions, and
# the fake upstream started with a script, with the config r.yaml that
# points loom at it (also standing in for SearXNG: its plain responses
# answer the search GETs). Needs LOOM_BIN and LOOM_FAKE_BIN.
# Like every CLI test, it runs loom under `env -i` with TSAN_OPTIONS passed
# on when set: scripts/tsan.sh's suppressions (tsan.supp) would otherwise
# not reach loom, and TSan would report what they name.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom-research-XXXXXX")
fails=0
checks=0
fake_pid=""

cleanup() {
    [ -n "$fake_pid" ] && kill "$fake_pid" 2>/dev/null
    [ -n "${cleanup_more:-}" ] && $cleanup_more
    rm -rf "$tmp"
}
trap cleanup EXIT
# A signal (CTest's timeout, Ctrl-C) ends the test through exit, so that
# cleanup runs: the shell's own default would skip it.
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

ok() { checks=$((checks + 1)); }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }
expect_rc() { # expected actual what
    if [ "$1" -eq "$2" ]; then ok; else bad "$3: exit $2, expected $1"; fi
}
# Polls $tmp/$1.raw, a tmux pane's log, (at most 20 s) until the fixed
# text $2 is in it: pipe-pane's cat writes it behind the screen, so a
# check of the raw bytes first waits for what the screen already showed.
wait_raw() {
    i=0
    while [ $i -lt 400 ]; do
        grep -qF -- "$2" "$tmp/$1.raw" 2>/dev/null && return 0
        i=$((i + 1)); sleep 0.05
    done
    bad "the raw log of $1 never got '$2'"
    return 1
}
expect_grep() { # pattern file what
    if grep -q -- "$1" "$2"; then ok; else
        bad "$3: '$1' not in $2:"; sed 's/^/    /' "$2" | head -30; fi
}
expect_no_grep() { # pattern file what
    if grep -q -- "$1" "$2"; then bad "$3: '$1' in $2"; else ok; fi
}

# Starts the fake upstream with a script; writes the config r.yaml
# (web_search on the fake's SearXNG answers, prices $1/$2 per million).
start_fake() {
    printf '%s' "$1" > "$tmp/script.json"
    rm -f "$tmp/fake.out" "$tmp/requests.jsonl"
    "$LOOM_FAKE_BIN" --script "$tmp/script.json" --max-seconds 120 \
        --record "$tmp/requests.jsonl" > "$tmp/fake.out" 2>&1 &
    fake_pid=$!
    i=0
    while ! grep -q listening "$tmp/fake.out" 2>/dev/null; do
        i=$((i + 1)); [ $i -gt 200 ] && { bad "fake did not start"; return 1; }
        sleep 0.05
    done
    port=$(sed -n 's/^listening 127.0.0.1:\([0-9]*\).*/\1/p' "$tmp/fake.out")
    cat > "$tmp/r.yaml" <<EOF
providers:
  openai: {base_url: "http://127.0.0.1:$port/v1", api_key: sk-test, retries: {max: 0}}
routing: {retries: 0}
models:
  openai/gpt-4o-mini: {context_window: 128000, prices: {input: 1, output: 2}}
tools:
  web_search: {backend: searxng, base_url: "http://127.0.0.1:$port"}
agents:
  plain: {model: openai/gpt-4o-mini, tools: []}
EOF
}
stop_fake() {
    [ -n "$fake_pid" ] && kill "$fake_pid" 2>/dev/null && wait "$fake_pid" 2>/dev/null
    fake_pid=""
}
loom_research() {
    env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" "$LOOM_BIN" research -c "$tmp/r.yaml" "$@"
}


#!/bin/sh
# Shell tests of `loom serve`: help, bad flags and values, a real start
# with the "listening" line, the request log line, a port already taken,
# and a clean exit on SIGTERM. Needs LOOM_BIN and LOOM_FAKE_BIN (set by
# CTest). Everything listens on 127.0.0.1 and is stopped at the end.
set -u
: "${LOOM_BIN:?}" "${LOOM_FAKE_BIN:?}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom-serve-XXXXXX")
fails=0
checks=0
serve_pid=""

cleanup() {
    [ -n "$serve_pid" ] && kill -9 "$serve_pid" 2>/dev/null
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

serve() {
    env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" "$LOOM_BIN" serve "$@"
}

# Starts loom serve in the background; sets serve_pid and addr.
start_serve() {
    rm -f "$tmp/serve.out"
    # env execs loom, so $! is loom itself.
    env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" "$LOOM_BIN" serve "$@" \
        > "$tmp/serve.out" 2> "$tmp/serve.err" &
    serve_pid=$!
    i=0
    while ! grep -q listening "$tmp/serve.out" 2>/dev/null; do
        i=$((i + 1))
        if [ $i -gt 400 ] || ! kill -0 "$serve_pid" 2>/dev/null; then
            bad "loom serve did not start"; cat "$tmp/serve.err"; return 1
        fi
        sleep 0.05
    done
    addr=$(sed -n 's/^listening \(127.0.0.1:[0-9]*\).*/\1/p' "$tmp/serve.out")
}

# --- help and usage errors ---
serve --help > "$tmp/out" 2>&1; expect_rc 0 $? "serve --help"
expect_grep "usage: loom serve" "$tmp/out" "serve --help"
expect_grep "\-\-listen HOST:PORT" "$tmp/out" "serve --help lists --listen"
"$LOOM_BIN" --help > "$tmp/out" 2>&1
expect_grep "serve " "$tmp/out" "loom --help lists serve"
serve --bogus > "$tmp/out" 2>&1; expect_rc 2 $? "unknown flag"
expect_grep "unknown option '--bogus'" "$tmp/out" "unknown flag message"
serve --listen > "$tmp/out" 2>&1; expect_rc 2 $? "flag without value"
expect_grep "needs a value" "$tmp/out" "flag without value message"
serve extra > "$tmp/out" 2>&1; expect_rc 2 $? "stray argument"
serve --log-level loud > "$tmp/out" 2>&1; expect_rc 2 $? "bad log level"
serve --db "$tmp/x.db" --listen nonsense > "$tmp/out" 2>&1
expect_rc 2 $? "bad listen address"
expect_grep "HOST:PORT" "$tmp/out" "bad listen address message"
serve --db /proc/nope/x.db > "$tmp/out" 2>&1; expect_rc 1 $? "bad --db"
expect_grep "^loom serve: store /proc/nope/x.db: cannot create /proc/nope" \
    "$tmp/out" "bad --db message"
if [ "$(grep -o "/proc/nope/x.db" "$tmp/out" | wc -l)" -eq 1 ]; then ok
else bad "bad --db: the location is repeated:"; cat "$tmp/out"; fi
printf 'server:\n  max_body_bytes: 10\n' > "$tmp/bad.yaml"
serve -c "$tmp/bad.yaml" > "$tmp/out" 2>&1; expect_rc 2 $? "bad server config"
expect_grep "server.max_body_bytes" "$tmp/out" "bad server config message"

# --- a real start, one request, a clean stop ---
if start_serve --listen 127.0.0.1:0 --db "$tmp/data/loom.db"; then
    [ -f "$tmp/data/loom.db" ] && ok || bad "the db and its folder are created"
    if command -v curl > /dev/null; then
        curl -s "http://$addr/healthz" > "$tmp/health" 2>&1
        expect_grep '"status":"ok"' "$tmp/health" "GET /healthz"
    fi
    # The same address again: taken.
    port=${addr#127.0.0.1:}
    serve --listen "127.0.0.1:$port" --db "$tmp/y.db" > "$tmp/out" 2>&1
    expect_rc 1 $? "address in use"
    expect_grep "cannot listen on 127.0.0.1:$port" "$tmp/out" "in use message"
    kill -TERM "$serve_pid"
    wait "$serve_pid"; expect_rc 0 $? "SIGTERM stops cleanly"
    serve_pid=""
    expect_grep "listening on http://127.0.0.1:0" "$tmp/serve.err" "start log"
    if command -v curl > /dev/null; then
        expect_grep "GET /healthz 200" "$tmp/serve.err" "request log line"
    fi
    expect_grep "stopped" "$tmp/serve.err" "stop log"
fi

# --- no provider: a given config is an error, the environment alone the
# offline demo, where the README's example works without a key ---
printf 'server:\n  max_body_bytes: 4096\n' > "$tmp/noprov.yaml"
serve -c "$tmp/noprov.yaml" --db "$tmp/z.db" > "$tmp/out" 2>&1
expect_rc 2 $? "a config naming no provider"
expect_grep "names no model provider" "$tmp/out" "no provider message"
if start_serve --listen 127.0.0.1:0 --db "$tmp/demo.db"; then
    expect_grep "OFFLINE DEMO" "$tmp/serve.err" "offline demo said at start"
    if command -v curl > /dev/null; then
        curl -s "http://$addr/readyz" > "$tmp/ready" 2>&1
        expect_grep '"offline_demo":true' "$tmp/ready" "/readyz says demo"
        curl -s "http://$addr/v1/models" > "$tmp/models" 2>&1
        expect_grep '"offline_demo":true' "$tmp/models" "/v1/models says demo"
        # The README's example, verbatim but for the address.
        curl -s -N "http://$addr/v1/runs" \
            -d '{"input": "What time is it in Tokyo?", "stream": true}' \
            > "$tmp/run" 2>&1
        expect_grep "event: run.completed" "$tmp/run" "README example completes"
        expect_grep "offline demo" "$tmp/run" "README example answered"
        expect_grep '"name":"get_time"' "$tmp/run" "demo runs get_time"
    fi
    kill -TERM "$serve_pid"
    wait "$serve_pid"; expect_rc 0 $? "offline demo stops cleanly"
    serve_pid=""
fi

echo "serve: $checks checks, $fails failed"
[ "$fails" -eq 0 ]

#!/bin/sh
# Measures what API keys and limits add to a request of `loom serve`: the
# same short pass-through request (bench/serve.sh's "short" answer) to two
# servers side by side, one in auth mode none and one in auth mode keys
# whose key has every limit (requests and tokens per minute, concurrent
# runs, a budget, all far above the load, and the key's user and
# workspace with limits of their own), so every request is a key check,
# an admission against three scopes (a store read of the user's and
# workspace's limits) and a budget reservation and settlement (a store
# write) around its model call. Writes the "Keys and limits" section of
# bench/RESULTS-serve.md (replacing an earlier one).
#
#   sh bench/serve-limits.sh
#
# Environment (defaults in brackets): N [2000] measured requests per
# server at concurrency 1, WARMUP [500], ROUNDS [8] interleaved blocks; C
# [64] connections and DURATION [10] measured seconds (after TP_WARMUP
# [2]) at concurrency C; SERVEBENCH_BUILD [build-servebench] (the Release
# build bench/serve.sh makes; built here when missing). Every process
# listens on 127.0.0.1 only and is stopped by its pid on exit.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
HERE=$ROOT/bench/serve
BUILD=${SERVEBENCH_BUILD:-$ROOT/build-servebench}
OUT=$HERE/out
RESULTS=${RESULTS:-$ROOT/bench/RESULTS-serve.md}
N=${N:-2000}
WARMUP=${WARMUP:-500}
ROUNDS=${ROUNDS:-8}
C=${C:-64}
DURATION=${DURATION:-10}
TP_WARMUP=${TP_WARMUP:-2}
LOADGEN=$BUILD/servebench-loadgen
FAKE=$BUILD/loom-fake-upstream
LOOM=$BUILD/loom
TEXT="Hi there."

say() { echo "serve-limits: $*" >&2; }
fail() { say "$*"; exit 1; }

mkdir -p "$OUT"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/loom-servelimits.XXXXXX")
PIDS=""
cleanup() {
    for pid in $PIDS; do
        kill -CONT "$pid" 2>/dev/null || true
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in $PIDS; do
        i=0
        while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do
            sleep 0.1
            i=$((i + 1))
        done
        kill -KILL "$pid" 2>/dev/null || true
    done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_line FILE PID: the port of "listening 127.0.0.1:P" in FILE.
wait_line() {
    i=0
    while [ $i -lt 150 ]; do
        p=$(sed -n 's/^listening 127\.0\.0\.1:\([0-9][0-9]*\)$/\1/p' \
            "$1" 2>/dev/null | head -1)
        [ -n "$p" ] && { echo "$p"; return 0; }
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

if [ ! -x "$LOOM" ] || [ ! -x "$LOADGEN" ] || [ ! -x "$FAKE" ] ||
    [ -n "$(find "$ROOT/src" "$ROOT/include" -newer "$LOOM" -name '*.[ch]' |
        head -1)" ]; then
    say "building (Release) in $BUILD"
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_C_FLAGS=-g -DLOOM_TESTS=OFF >"$OUT/limits-build.log" 2>&1
    cmake --build "$BUILD" --target loom loom-fake-upstream -j2 \
        >>"$OUT/limits-build.log" 2>&1
    cc -std=c11 -O2 -g -D_GNU_SOURCE -o "$LOADGEN" "$HERE/loadgen.c" \
        "$HERE/resp.c" "$HERE/resp_test.c" >>"$OUT/limits-build.log" 2>&1
fi

printf '%s\n' '{"loop": true, "responses": [{"text": ["Hi", " there."],
  "usage": {"prompt_tokens": 10, "completion_tokens": 2,
            "total_tokens": 12}}]}' >"$TMP/short.json"
"$FAKE" --script "$TMP/short.json" --port 0 --max-seconds 3600 \
    >"$TMP/fake.out" 2>"$OUT/limits-fake.err" &
FAKE_PID=$!
PIDS="$PIDS $FAKE_PID"
FAKE_PORT=$(wait_line "$TMP/fake.out" "$FAKE_PID") || fail "no fake"

# start NAME AUTH-MODE: a loom serve with its own store; sets PORT, PID.
start() {
    cat >"$TMP/$1.yaml" <<EOF
log:
  level: warn
providers:
  fake:
    kind: openai
    base_url: http://127.0.0.1:$FAKE_PORT/v1
    api_key: servebench
    retries:
      max: 0
models:
  fake/fake-model:
    prices: {input: 0.15, output: 0.60}
server:
  listen: 127.0.0.1:0
  max_concurrent_runs: 1024
  max_connections: 4096
auth:
  mode: $2
EOF
    "$LOOM" serve --config "$TMP/$1.yaml" --db "$TMP/$1.db" \
        --log-level warn >"$TMP/$1.out" 2>"$OUT/limits-$1.err" &
    PID=$!
    PIDS="$PIDS $PID"
    PORT=$(wait_line "$TMP/$1.out" "$PID") || fail "loom ($1) did not start"
}

start plain none
PLAIN_PORT=$PORT PLAIN_PID=$PID
"$LOOM" keys create --db "$TMP/keys.db" --user bench --workspace lab \
    --rpm 1000000000 --tpm 1000000000 --max-concurrent 100000 \
    --budget-usd 1000000 --budget-period month >"$TMP/key.out"
"$LOOM" keys limits --db "$TMP/keys.db" --workspace lab --user bench \
    --rpm 1000000000 --budget-usd 1000000 >/dev/null
"$LOOM" keys limits --db "$TMP/keys.db" --workspace lab \
    --rpm 1000000000 --budget-usd 1000000 >/dev/null
KEY=$(tail -1 "$TMP/key.out")
start keys keys
KEYS_PORT=$PORT KEYS_PID=$PID

run() {
    name=$1
    shift
    say "$name: $*"
    "$LOADGEN" "$@" --expect "$TEXT" --json --max-seconds 1200 \
        --target plain "http://127.0.0.1:$PLAIN_PORT/v1/chat/completions" \
        --model fake/fake-model --pid "$PLAIN_PID" \
        --target keys "http://127.0.0.1:$KEYS_PORT/v1/chat/completions" \
        --model fake/fake-model --header "Authorization: Bearer $KEY" \
        --pid "$KEYS_PID" >"$OUT/limits-$name.json" 2>"$OUT/limits-$name.err" ||
        { cat "$OUT/limits-$name.err" >&2; fail "$name failed"; }
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
run c1 --concurrency 1 --requests "$N" --warmup "$WARMUP" --rounds "$ROUNDS"
run c64 --concurrency "$C" --duration "$DURATION" \
    --warmup-seconds "$TP_WARMUP"
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# Every keyed request was counted: the stored spend is their cost.
SPENT=$(sqlite3 "$TMP/keys.db" \
    "SELECT sum(spent_micros) FROM budget_spend WHERE scope LIKE 'key:%'" \
    2>/dev/null || echo "?")

get() {
    grep "^{\"target\":\"$2\"" "$OUT/limits-$1.json" |
        sed -n "s/.*\"$3\":\([-0-9.]*\).*/\1/p" | head -1
}
row() {
    a=$(get "$2" plain "$3") b=$(get "$2" keys "$3")
    awk -v l="$1" -v a="$a" -v b="$b" -v u="$4" 'BEGIN {
        if (u == "rps")
            printf "| %s | %.0f req/s | %.0f req/s | %.2fx |\n", l, a, b, b / a
        else
            printf "| %s | %.1f µs | %.1f µs | %+.1f µs |\n", l, a, b, b - a }'
}

{
    echo "## Keys and limits"
    echo
    echo "Written by \`sh bench/serve-limits.sh\` on $(date -u \
        '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$ROOT" rev-parse --short \
        HEAD), on the machine above (load average $LOAD_BEFORE before,"
    echo "$LOAD_AFTER after). The short pass-through request to loom serve in"
    echo "auth mode none, and to loom serve in auth mode keys with a key"
    echo "that has every limit (rpm, tpm, concurrent runs, a monthly budget;"
    echo "its user and workspace have an rpm and a budget too), side by side"
    echo "in one run. \"keys\" minus \"none\" is what the key check (a store"
    echo "read and an HMAC), the admission against three scopes (a store"
    echo "read of the user's and workspace's limits) and the budget"
    echo "reservation and settlement of its model call (a store write of"
    echo "the spend of three scopes) add to one request."
    echo
    echo "| | auth none | auth keys + limits | added |"
    echo "|---|---:|---:|---:|"
    row "c=1: latency p50" c1 lat_p50_us us
    row "c=1: latency p99" c1 lat_p99_us us
    row "c=$C: latency p50" c64 lat_p50_us us
    row "c=$C: latency p99" c64 lat_p99_us us
    row "c=$C: throughput" c64 rps rps
    echo
    echo "- c=1: $N measured requests per server after $WARMUP warm-up, in"
    echo "  $ROUNDS blocks alternating between them; c=$C: every connection"
    echo "  busy for $DURATION s (after $TP_WARMUP s unmeasured), one server"
    echo "  after the other."
    echo "- Spend stored for the key at the end: $SPENT micro-dollars (every"
    echo "  keyed request's call, at 0.15/0.60 dollars per million tokens)."
} >"$TMP/section.md"

if [ -f "$RESULTS" ] && grep -q '^## Keys and limits$' "$RESULTS"; then
    awk 'BEGIN { skip = 0 }
        /^## Keys and limits$/ { skip = 1; next }
        skip && /^## / { skip = 0 }
        !skip' "$RESULTS" >"$TMP/rest.md"
else
    cp "$RESULTS" "$TMP/rest.md"
fi
{ cat "$TMP/rest.md"; echo; cat "$TMP/section.md"; } >"$RESULTS"
say "wrote $RESULTS"

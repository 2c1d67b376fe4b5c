#!/bin/sh
# Measures `loom serve` as a pass-through (no tools) in front of the fake
# upstream, beside the Portkey AI gateway in front of the same fake, and
# the fake on its own, in one run; writes bench/RESULTS-serve.md (see
# bench/serve/README.md for what is measured and why).
#
#   sh bench/serve.sh                  # measure, then write the results
#   REPORT_ONLY=1 sh bench/serve.sh    # rewrite them from bench/serve/out
#
# Steps: a Release build of loom and loom-fake-upstream in its own build
# directory and of the load generator (bench/serve/loadgen.c and resp.c,
# cc directly), whose --self-test must pass; two fakes (a short answer; 64
# chunks 20 ms apart), loom serve with a config naming them, the Portkey
# gateway
# (`npm ci` in bench/serve; left out, with the reason in the results, when
# node or npm is missing or it does not answer), nginx as a plain reverse
# proxy in front of the same fakes (Debian's nginx-light, installed when
# missing and the script runs as root; left out, with the reason, when it
# cannot be had or does not answer); a smoke check of every
# target; the scenarios; the results file. Every process listens on
# 127.0.0.1 only, is stopped by its pid on exit (SIGCONT, SIGTERM, then
# SIGKILL after 10 s), and the fakes end themselves after an hour in any
# case. Raw outputs stay in bench/serve/out/ (ignored by git).
#
# Environment (defaults in brackets): N [2000] measured requests per target
# at concurrency 1, WARMUP [500] warm-up requests before them, ROUNDS [8]
# interleaved blocks; C [64] connections and DURATION [10] measured seconds
# (after TP_WARMUP [2]) for throughput; TTFT_N [100] streams of CHUNKS [64]
# chunks CHUNK_MS [20] ms apart; PORTKEY=0 leaves Portkey out, NGINX=0
# nginx; NICE [-10]:
# the niceness of every process of the benchmark once the build is done (0
# leaves it; negative values need root); SERVEBENCH_BUILD
# [build-servebench]; RESULTS [bench/RESULTS-serve.md]. The open-streams
# scenario: STREAMS [10000] streams at once, each STREAM_CHUNKS [97] text
# chunks with STREAM_MS [100] ms before every chunk (about 10 s), opened
# OPEN_PER_MS [20] a millisecond, each target's block cut after
# STREAMS_CAP [60] s. SCENARIOS [all]: `streams` runs only that scenario,
# `classic` all but it; with anything but all, RESULTS defaults to
# bench/serve/out/RESULTS-serve.md so the committed file is kept.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
HERE=$ROOT/bench/serve
BUILD=${SERVEBENCH_BUILD:-$ROOT/build-servebench}
OUT=$HERE/out
RESULTS=${RESULTS:-}
N=${N:-2000}
WARMUP=${WARMUP:-500}
ROUNDS=${ROUNDS:-8}
C=${C:-64}
DURATION=${DURATION:-10}
TP_WARMUP=${TP_WARMUP:-2}
TTFT_N=${TTFT_N:-100}
CHUNKS=${CHUNKS:-64}
CHUNK_MS=${CHUNK_MS:-20}
STREAMS=${STREAMS:-10000}
STREAM_CHUNKS=${STREAM_CHUNKS:-97}
STREAM_MS=${STREAM_MS:-100}
STREAMS_CAP=${STREAMS_CAP:-60}
OPEN_PER_MS=${OPEN_PER_MS:-20}
SCENARIOS=${SCENARIOS:-all}
case $SCENARIOS in
all | streams | classic) ;;
*) echo "serve-bench: SCENARIOS is all, streams or classic" >&2; exit 2 ;;
esac
[ "$SCENARIOS" != all ] && RESULTS=${RESULTS:-$OUT/RESULTS-serve.md}
RESULTS=${RESULTS:-$ROOT/bench/RESULTS-serve.md}
THREADS_GOAL=256         # "threads bounded": loom's threads at peak under it
KB_GOAL=64               # memory per open stream, KB
GAP_GOAL=100             # added time per chunk p99, µs
NICE=${NICE:--10}
PORTKEY_VERSION=1.15.2
HONO_NODE_VERSION=1.12.2
LOADGEN=$BUILD/servebench-loadgen
FAKE=$BUILD/loom-fake-upstream
LOOM=$BUILD/loom
SHORT_TEXT="Hi there."
START_TRIES=150          # x 0.1 s: how long a process may take to listen
LOADGEN_MAX_SECONDS=1200 # one scenario, all targets

say() { echo "serve-bench: $*" >&2; }
fail() { say "$*"; exit 1; }

# wait_line FILE PID: waits until FILE holds "listening 127.0.0.1:P" and
# prints P; fails when PID exits first or after START_TRIES tries.
wait_line() {
    i=0
    while [ $i -lt $START_TRIES ]; do
        p=$(sed -n 's/^listening 127\.0\.0\.1:\([0-9][0-9]*\)$/\1/p' \
            "$1" 2>/dev/null | head -1)
        if [ -n "$p" ]; then
            echo "$p"
            return 0
        fi
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

# cpu_ticks PID: user + system CPU time of a process, in clock ticks.
cpu_ticks() {
    awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"
}

# quote VALUE: VALUE as one single-quoted shell word.
quote() {
    printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"
}

# ======================================================================
# Measuring
# ======================================================================

build() {
    say "building (Release) in $BUILD"
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_C_FLAGS=-g -DLOOM_TESTS=OFF >"$OUT/build.log" 2>&1 ||
        { cat "$OUT/build.log" >&2; exit 1; }
    cmake --build "$BUILD" --target loom loom-fake-upstream -j2 \
        >>"$OUT/build.log" 2>&1 || { cat "$OUT/build.log" >&2; exit 1; }
    CC_PATH=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
    CFLAGS_USED="$(sed -n 's/^CMAKE_C_FLAGS_RELEASE:[A-Z]*=//p' \
        "$BUILD/CMakeCache.txt") -g"
    CCV=$("$CC_PATH" --version | head -1)
    # shellcheck disable=SC2086
    "$CC_PATH" -std=c11 -O2 -g -D_GNU_SOURCE -Wall -Wextra -Wshadow \
        -Wformat=2 -Wstrict-prototypes -Wmissing-prototypes -Wvla \
        -o "$LOADGEN" "$HERE/loadgen.c" "$HERE/resp.c" "$HERE/resp_test.c" \
        >>"$OUT/build.log" 2>&1 ||
        { cat "$OUT/build.log" >&2; exit 1; }
    "$LOADGEN" --self-test 2>>"$OUT/build.log" ||
        fail "loadgen --self-test failed (see $OUT/build.log)"
}

# On a machine shared with other work, a thread woken on a busy core can
# wait a whole scheduler tick; a higher priority for everything measured
# (load generator, fakes, servers: they inherit it from this shell) keeps
# other work out of the critical path. Every target gets the same.
set_priority() {
    NICE_NOTE="niceness $NICE for every process of the benchmark"
    if [ "$NICE" = 0 ]; then
        NICE_NOTE="niceness left unchanged (NICE=0)"
    elif ! renice -n "$NICE" -p $$ >/dev/null 2>&1; then
        NICE_NOTE="niceness left unchanged (renice to $NICE was refused)"
        say "$NICE_NOTE"
    fi
}

# chunk_script PREFIX COUNT DELAY_MS FILE: writes a looping script of
# COUNT text chunks ("PREFIX0 ", "PREFIX1 ", ...), DELAY_MS before every
# chunk, to FILE, and sets TEXT to the whole answer.
chunk_script() {
    pieces=""
    TEXT=""
    i=0
    while [ $i -lt "$2" ]; do
        pieces="$pieces${pieces:+,}\"$1$i \""
        TEXT="$TEXT$1$i "
        i=$((i + 1))
    done
    printf '{"loop": true, "responses": [{"text": [%s],
      "chunk_delay_ms": %s, "usage": {"prompt_tokens": 10,
      "completion_tokens": %s, "total_tokens": %s}}]}\n' "$pieces" \
        "$3" "$2" $(($2 + 10)) >"$4"
}

# short: "Hi there." in two chunks, no delay. long: CHUNKS text chunks,
# every chunk (the role chunk, each text chunk, the finish chunk and
# [DONE]) CHUNK_MS after the previous one.
# slow: the open-streams scenario's, STREAM_CHUNKS chunks STREAM_MS apart.
start_fakes() {
    printf '%s\n' '{"loop": true, "responses": [{"text": ["Hi", " there."],
      "usage": {"prompt_tokens": 10, "completion_tokens": 2,
                "total_tokens": 12}}]}' >"$TMP/short.json"
    chunk_script w "$CHUNKS" "$CHUNK_MS" "$TMP/long.json"
    LONG_TEXT=$TEXT
    chunk_script s "$STREAM_CHUNKS" "$STREAM_MS" "$TMP/slow.json"
    STREAM_TEXT=$TEXT
    for f in short long slow; do
        "$FAKE" --script "$TMP/$f.json" --port 0 --max-seconds 3600 \
            >"$TMP/fake-$f.out" 2>"$OUT/fake-$f.err" &
        pid=$!
        PIDS="$PIDS $pid"
        port=$(wait_line "$TMP/fake-$f.out" "$pid") ||
            fail "the fake ($f) did not start: $(cat "$OUT/fake-$f.err")"
        case $f in
        short) SHORT_PORT=$port ;;
        long) LONG_PORT=$port ;;
        slow) SLOW_PORT=$port SLOW_PID=$pid ;;
        esac
    done
}

# Providers `fake` (short answers) and `fake64` (the long stream), no
# retries; runs limited to 1024 at once so that C connections never meet
# 503; log level warn, so no line per request (errors still go to
# out/loom.err). The store is a fresh SQLite file in the temporary folder.
start_loom() {
    cat >"$TMP/loom.yaml" <<EOF
log:
  level: warn
providers:
  fake:
    kind: openai
    base_url: http://127.0.0.1:$SHORT_PORT/v1
    api_key: servebench
    retries:
      max: 0
  fake64:
    kind: openai
    base_url: http://127.0.0.1:$LONG_PORT/v1
    api_key: servebench
    retries:
      max: 0
server:
  listen: 127.0.0.1:0
  max_concurrent_runs: 1024
  max_connections: 4096
EOF
    "$LOOM" serve --config "$TMP/loom.yaml" --db "$TMP/loom.db" \
        --log-level warn >"$TMP/loom.out" 2>"$OUT/loom.err" &
    LOOM_PID=$!
    PIDS="$PIDS $LOOM_PID"
    LOOM_PORT=$(wait_line "$TMP/loom.out" "$LOOM_PID") ||
        fail "loom serve did not start: $(cat "$OUT/loom.err")"
    say "fake :$SHORT_PORT (short), :$LONG_PORT (long); loom :$LOOM_PORT"
}

# A second loom serve for the open-streams scenario, alone in its process
# so its memory, threads and descriptors are the streams' own: provider
# `slow` (the slow fake), limits well above STREAMS. Keys that this
# commit's loom does not know (docs/config.md) are left out, since loom
# refuses unknown keys.
start_loom_streams() {
    runs=$((STREAMS * 2))
    [ $runs -gt 100000 ] && runs=100000
    conns=$((STREAMS * 2 + 1000))
    STREAMS_KEYS="max_concurrent_runs: $runs, max_connections: $conns, provider connect_ms: $((STREAMS_CAP * 1000))"
    {
        cat <<EOF
log:
  level: warn
providers:
  slow:
    kind: openai
    base_url: http://127.0.0.1:$SLOW_PORT/v1
    api_key: servebench
    retries:
      max: 0
    timeouts:
      connect_ms: $((STREAMS_CAP * 1000))
server:
  listen: 127.0.0.1:0
  max_concurrent_runs: $runs
  max_connections: $conns
EOF
        key=max_connections_per_address
        if grep -q "\`$key\`" "$ROOT/docs/config.md"; then
            echo "  $key: $conns"
            STREAMS_KEYS="$STREAMS_KEYS, $key: $conns"
        fi
    } >"$TMP/loom-streams.yaml"
    "$LOOM" serve --config "$TMP/loom-streams.yaml" \
        --db "$TMP/loom-streams.db" --log-level warn \
        >"$TMP/loom-streams.out" 2>"$OUT/loom-streams.err" &
    LOOMS_PID=$!
    PIDS="$PIDS $LOOMS_PID"
    LOOMS_PORT=$(wait_line "$TMP/loom-streams.out" "$LOOMS_PID") ||
        fail "loom serve (streams) did not start: \
$(cat "$OUT/loom-streams.err")"
    say "fake :$SLOW_PORT (slow); loom (streams) :$LOOMS_PORT"
}

start_portkey() {
    PORTKEY_PORT=""
    PORTKEY_PID=""
    PORTKEY_NOTE=""
    PK_INSTALLED=""
    NODE_VERSION="not used"
    if [ "${PORTKEY:-1}" = 0 ]; then
        PORTKEY_NOTE="Portkey was left out (PORTKEY=0)."
        return 0
    fi
    if ! command -v node >/dev/null 2>&1 ||
        ! command -v npm >/dev/null 2>&1; then
        NODE_VERSION="not installed"
        PORTKEY_NOTE="Portkey was not measured: node and npm are not
installed."
        return 0
    fi
    NODE_VERSION=$(node --version)
    say "portkey: npm ci"
    if ! (cd "$HERE" && npm ci --no-audit --no-fund >"$OUT/npm-ci.log" 2>&1)
    then
        PORTKEY_NOTE="Portkey was not measured: \`npm ci\` failed in
bench/serve (\`$(tail -1 "$OUT/npm-ci.log")\`)."
        return 0
    fi
    (cd "$HERE" && NODE_ENV=production \
        SERVEBENCH_PORT_FILE="$TMP/portkey.port" exec node \
        --import ./portkey-localhost.mjs \
        node_modules/@portkey-ai/gateway/build/start-server.js \
        --port=0 --headless >"$OUT/portkey.log" 2>&1) &
    PORTKEY_PID=$!
    PIDS="$PIDS $PORTKEY_PID"
    if ! PORTKEY_PORT=$(wait_line "$TMP/portkey.port" "$PORTKEY_PID"); then
        PORTKEY_PORT=""
        PORTKEY_NOTE="Portkey was not measured: the gateway did not start
listening (its output: \`$(tail -3 "$OUT/portkey.log" | tr '\n' ' ')\`)."
        return 0
    fi
    version_of() {
        sed -n 's/^  "version": *"\([^"]*\)".*/\1/p' \
            "$HERE/node_modules/$1/package.json" | head -1
    }
    PK_INSTALLED="@portkey-ai/gateway $(version_of @portkey-ai/gateway),"
    PK_INSTALLED="$PK_INSTALLED @hono/node-server"
    PK_INSTALLED="$PK_INSTALLED $(version_of @hono/node-server)"
    say "portkey gateway :$PORTKEY_PORT"
}

# nginx as a reverse proxy that stores nothing and parses no body: the
# least any relay in front of the fake costs on this machine (two
# workers, keep-alive both ways, no buffering, no log per request). It
# cannot listen on port 0 and say which port it got, so ports are tried
# from a number drawn from the script's pid; nginx writes its pid file
# once it listens. Run in a session of its own (setsid) so that loadgen
# can pause its master and workers together (--pgid).
start_nginx() {
    NGINX_PORT=""
    NGINX_PID=""
    NGINX_NOTE=""
    NGINX_VERSION=""
    if [ "${NGINX:-1}" = 0 ]; then
        NGINX_NOTE="nginx was left out (NGINX=0)."
        return 0
    fi
    if ! command -v nginx >/dev/null 2>&1 && [ "$(id -u)" = 0 ] &&
        command -v apt-get >/dev/null 2>&1; then
        say "nginx: apt-get install nginx-light"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends nginx-light >"$OUT/nginx-apt.log" 2>&1 ||
            true
    fi
    if ! command -v nginx >/dev/null 2>&1; then
        NGINX_NOTE="nginx was not measured: it is not installed (Debian:
\`apt-get install nginx-light\`)."
        return 0
    fi
    NGINX_VERSION=$(nginx -v 2>&1 | sed 's/^nginx version: //')
    port=$((20000 + $$ % 20000))
    tries=0
    while [ $tries -lt 10 ]; do
        cat >"$TMP/nginx.conf" <<EOF
daemon off;
worker_processes 2;
pid $TMP/nginx.pid;
error_log $OUT/nginx.err warn;
events { worker_connections 8192; }
http {
    access_log off;
    keepalive_requests 1000000;
    upstream short { server 127.0.0.1:$SHORT_PORT; keepalive 256;
                     keepalive_requests 1000000; }
    upstream long { server 127.0.0.1:$LONG_PORT; keepalive 256;
                    keepalive_requests 1000000; }
    server {
        listen 127.0.0.1:$port;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_buffering off;
        location /short/ { proxy_pass http://short/; }
        location /long/ { proxy_pass http://long/; }
    }
}
EOF
        rm -f "$TMP/nginx.pid"
        setsid nginx -c "$TMP/nginx.conf" -e "$OUT/nginx.err" \
            >"$OUT/nginx.log" 2>&1 &
        NGINX_PID=$!
        i=0
        while [ $i -lt $START_TRIES ] && [ ! -s "$TMP/nginx.pid" ] &&
            kill -0 "$NGINX_PID" 2>/dev/null; do
            sleep 0.1
            i=$((i + 1))
        done
        if [ -s "$TMP/nginx.pid" ]; then
            # The master, the leader of nginx's process group.
            NGINX_PID=$(cat "$TMP/nginx.pid")
            PIDS="$PIDS $NGINX_PID"
            NGINX_PORT=$port
            say "nginx :$NGINX_PORT"
            return 0
        fi
        kill "$NGINX_PID" 2>/dev/null || true
        wait "$NGINX_PID" 2>/dev/null || true
        grep -q 'Address already in use' "$OUT/nginx.err" 2>/dev/null ||
            break
        port=$((port + 1))
        tries=$((tries + 1))
    done
    NGINX_PID=""
    NGINX_NOTE="nginx was not measured: it did not start (its output:
\`$(tail -2 "$OUT/nginx.err" 2>/dev/null | tr '\n' ' ')\`)."
}

# targets SCRIPT [WHICH]: the loadgen arguments, one a line, for the
# targets against the short or long fake: all (default), core (fake and
# loom), portkey or nginx (nginx only in front of the short and long
# fakes, not in the open-streams scenario). The fake direct comes first:
# it is the baseline.
targets() {
    lp=$LOOM_PORT lpid=$LOOM_PID script=$1
    case $1 in
    short) fp=$SHORT_PORT lm=fake ;;
    long) fp=$LONG_PORT lm=fake64 ;;
    slow) fp=$SLOW_PORT lm=slow lp=$LOOMS_PORT lpid=$LOOMS_PID ;;
    esac
    set -- "${2:-all}"
    if [ "$1" = all ] || [ "$1" = core ]; then
        printf '%s\n' \
            --target fake "http://127.0.0.1:$fp/v1/chat/completions" \
            --target loom "http://127.0.0.1:$lp/v1/chat/completions" \
            --model "$lm/fake-model" --pid "$lpid"
    fi
    if { [ "$1" = all ] || [ "$1" = nginx ]; } && [ -n "$NGINX_PORT" ] &&
        [ "$script" != slow ]; then
        printf '%s\n' --target nginx \
            "http://127.0.0.1:$NGINX_PORT/$script/v1/chat/completions" \
            --model fake-model --pgid "$NGINX_PID"
    fi
    if { [ "$1" = all ] || [ "$1" = portkey ]; } && [ -n "$PORTKEY_PORT" ]
    then
        printf '%s\n' --target portkey \
            "http://127.0.0.1:$PORTKEY_PORT/v1/chat/completions" \
            --model fake-model --header "x-portkey-provider: openai" \
            --header "x-portkey-custom-host: http://127.0.0.1:$fp/v1" \
            --header "Authorization: Bearer servebench" --pid "$PORTKEY_PID"
    fi
}

# loadgen_on SCRIPT WHICH OUTFILE LOADGEN-OPTIONS...: runs loadgen on
# those targets (their arguments contain spaces: read line by line).
loadgen_on() {
    targets "$1" "$2" >"$TMP/targets"
    lg_out=$3
    shift 3
    while IFS= read -r a; do set -- "$@" "$a"; done <"$TMP/targets"
    "$LOADGEN" "$@" >"$lg_out" 2>&1
}

# Every target answers, streamed and not; a peer (Portkey, nginx) may
# drop out (with the reason in the results), the others may not.
smoke() {
    for stream in 0 1; do
        set --
        [ "$stream" = 1 ] && set -- --stream
        loadgen_on short core "$OUT/smoke.txt" --requests 3 "$@" \
            --expect "$SHORT_TEXT" --max-seconds 60 ||
            { cat "$OUT/smoke.txt" >&2; fail "smoke check failed"; }
        smoke_peer portkey Portkey "$@"
        smoke_peer nginx nginx "$@"
    done
}

# smoke_peer TARGET LABEL [LOADGEN-OPTIONS]: a peer whose answers fail
# the check is left out: its PORT variable emptied, its NOTE saying why.
smoke_peer() {
    up=$(echo "$1" | tr '[:lower:]' '[:upper:]')
    eval "port=\$${up}_PORT"
    [ -n "$port" ] || return 0
    t=$1 label=$2
    shift 2
    loadgen_on short "$t" "$OUT/smoke-$t.txt" --requests 3 "$@" \
        --expect "$SHORT_TEXT" --max-seconds 60 && return 0
    note="$label was not measured: its answers failed the
check (\`$(grep '^loadgen' "$OUT/smoke-$t.txt" | head -1)\`)."
    eval "${up}_NOTE=\$note ${up}_PORT=''"
    say "$note"
}

# group_ticks PGID: cpu_ticks summed over a process group (nginx's master
# and workers).
group_ticks() {
    t=0
    for gp in $(pgrep -g "$1" 2>/dev/null); do
        t=$((t + $(cpu_ticks "$gp" 2>/dev/null || echo 0)))
    done
    echo "$t"
}

# What each server burns doing nothing, over 2 s, in % of one core.
idle_cpu() {
    l0=$(cpu_ticks "$LOOM_PID")
    [ -n "$PORTKEY_PORT" ] && p0=$(cpu_ticks "$PORTKEY_PID")
    sleep 2
    pct() { awk -v a="$1" -v b="$2" -v hz="$HZ" \
        'BEGIN { printf "%.0f", (b - a) / hz / 2 * 100 }'; }
    LOOM_IDLE=$(pct "$l0" "$(cpu_ticks "$LOOM_PID")")
    PORTKEY_IDLE=""
    if [ -n "$PORTKEY_PORT" ]; then
        PORTKEY_IDLE=$(pct "$p0" "$(cpu_ticks "$PORTKEY_PID")")
    fi
}

# scenario NAME SCRIPT EXPECT LOADGEN-OPTIONS...: every target, JSON lines
# into out/NAME.json, the servers' CPU ticks into out/NAME.cpu; a failed
# request stops the benchmark.
scenario() {
    name=$1 script=$2 expect=$3
    shift 3
    say "$name: $*"
    targets "$script" all >"$TMP/targets"
    set -- "$@" --expect "$expect" --max-seconds $LOADGEN_MAX_SECONDS --json
    while IFS= read -r a; do set -- "$@" "$a"; done <"$TMP/targets"
    l0=$(cpu_ticks "$LOOM_PID")
    [ -n "$PORTKEY_PORT" ] && p0=$(cpu_ticks "$PORTKEY_PID")
    [ -n "$NGINX_PORT" ] && n0=$(group_ticks "$NGINX_PID")
    "$LOADGEN" "$@" >"$OUT/$name.json" 2>"$OUT/$name.err" || {
        cat "$OUT/$name.err" >&2
        fail "$name failed: no results written"
    }
    # Each server only runs during its own blocks (loadgen pauses it
    # otherwise), so this is its cost for the requests it answered.
    echo "loom $(($(cpu_ticks "$LOOM_PID") - l0))" >"$OUT/$name.cpu"
    if [ -n "$PORTKEY_PORT" ]; then
        echo "portkey $(($(cpu_ticks "$PORTKEY_PID") - p0))" \
            >>"$OUT/$name.cpu"
    fi
    if [ -n "$NGINX_PORT" ]; then
        echo "nginx $(($(group_ticks "$NGINX_PID") - n0))" >>"$OUT/$name.cpu"
    fi
}

# sample NAME PID PORT: one line "NAME RSS-KB THREADS FDS CONNS" for a
# live process; CONNS: established connections to its listening PORT.
sample() {
    [ -n "$2" ] && [ -r "/proc/$2/status" ] || return 0
    conns=0
    if [ -n "$3" ] && command -v ss >/dev/null 2>&1; then
        conns=$(ss -Htn state established "( sport = :$3 )" | wc -l)
    fi
    awk -v n="$1" -v fds="$(ls "/proc/$2/fd" 2>/dev/null | wc -l)" \
        -v c="$conns" '/^VmRSS:/ { r = $2 } /^Threads:/ { t = $2 }
        END { print n, r, t, fds, c }' "/proc/$2/status"
}

# The open-streams scenario: STREAMS streams at once through each target
# in turn (loadgen --once), each target cut after STREAMS_CAP s. A
# sampler notes loom's and Portkey's memory, threads and descriptors every
# half second (the first lines, "base-*", before any stream); failures are
# results here, not a reason to stop.
streams() {
    say "streams: $STREAMS at once, $STREAM_CHUNKS chunks $STREAM_MS ms apart"
    start_loom_streams
    targets slow all >"$TMP/targets"
    set -- --once --stream --gaps --concurrency "$STREAMS" \
        --open-per-ms "$OPEN_PER_MS" --block-seconds "$STREAMS_CAP" \
        --expect "$STREAM_TEXT" --json \
        --max-seconds $((3 * (STREAMS_CAP + 60)))
    while IFS= read -r a; do set -- "$@" "$a"; done <"$TMP/targets"
    {
        sample base-loom "$LOOMS_PID" "$LOOMS_PORT"
        sample base-portkey "$PORTKEY_PID" "$PORTKEY_PORT"
    } >"$OUT/streams.samples"
    (
        while :; do
            sample loom "$LOOMS_PID" "$LOOMS_PORT"
            sample portkey "$PORTKEY_PID" "$PORTKEY_PORT"
            sleep 0.5
        done
    ) >>"$OUT/streams.samples" &
    sampler=$!
    PIDS="$PIDS $sampler"
    l0=$(cpu_ticks "$LOOMS_PID")
    f0=$(cpu_ticks "$SLOW_PID")
    [ -n "$PORTKEY_PORT" ] && p0=$(cpu_ticks "$PORTKEY_PID")
    rc=0
    "$LOADGEN" "$@" >"$OUT/streams.json" 2>"$OUT/streams.err" || rc=$?
    echo "loom $(($(cpu_ticks "$LOOMS_PID") - l0))" >"$OUT/streams.cpu"
    echo "fake $(($(cpu_ticks "$SLOW_PID") - f0))" >>"$OUT/streams.cpu"
    if [ -n "$PORTKEY_PORT" ]; then
        echo "portkey $(($(cpu_ticks "$PORTKEY_PID") - p0))" \
            >>"$OUT/streams.cpu"
    fi
    kill "$sampler" 2>/dev/null || true
    wait "$sampler" 2>/dev/null || true
    [ $rc -le 1 ] || { cat "$OUT/streams.err" >&2; fail "streams: loadgen"; }
    NOFILE_SOFT=$(awk '/^Max open files/ { print $4 }' "/proc/$$/limits")
    NOFILE_HARD=$(awk '/^Max open files/ { print $5 }' "/proc/$$/limits")
}

scenarios() {
    LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
    if [ "$SCENARIOS" != classic ]; then
        streams
    fi
    if [ "$SCENARIOS" = streams ]; then
        LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
        return 0
    fi
    scenario c1 short "$SHORT_TEXT" --concurrency 1 --requests "$N" \
        --warmup "$WARMUP" --rounds "$ROUNDS"
    scenario c1-stream short "$SHORT_TEXT" --stream --concurrency 1 \
        --requests "$N" --warmup "$WARMUP" --rounds "$ROUNDS"
    scenario c64 short "$SHORT_TEXT" --concurrency "$C" \
        --duration "$DURATION" --warmup-seconds "$TP_WARMUP"
    scenario c64-stream short "$SHORT_TEXT" --stream --concurrency "$C" \
        --duration "$DURATION" --warmup-seconds "$TP_WARMUP"
    ttft_rounds=5
    [ "$TTFT_N" -lt $ttft_rounds ] && ttft_rounds=$TTFT_N
    scenario ttft long "$LONG_TEXT" --stream --concurrency 1 --gaps \
        --requests "$TTFT_N" --warmup 2 --rounds "$ttft_rounds"
    LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
}

# What the report needs from the run, for REPORT_ONLY=1.
save_run() {
    COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "?")
    if [ -n "$(git -C "$ROOT" status --porcelain -- src include \
        2>/dev/null)" ]; then
        COMMIT="$COMMIT (the working tree had uncommitted changes under"
        COMMIT="$COMMIT src/ or include/)"
    fi
    RUN_DATE=$(date -u '+%Y-%m-%d %H:%M UTC')
    PORTKEY_MEASURED=${PORTKEY_PORT:+1}
    NGINX_MEASURED=${NGINX_PORT:+1}
    for v in N WARMUP ROUNDS C DURATION TP_WARMUP TTFT_N CHUNKS CHUNK_MS \
        HZ CCV CFLAGS_USED NODE_VERSION PK_INSTALLED NICE_NOTE LOAD_BEFORE \
        LOAD_AFTER LOOM_IDLE PORTKEY_IDLE PORTKEY_MEASURED PORTKEY_NOTE \
        NGINX_MEASURED NGINX_NOTE NGINX_VERSION \
        COMMIT RUN_DATE SCENARIOS STREAMS STREAM_CHUNKS STREAM_MS \
        STREAMS_CAP OPEN_PER_MS STREAMS_KEYS NOFILE_SOFT NOFILE_HARD; do
        eval "echo \"$v=\$(quote \"\$$v\")\""
    done >"$OUT/run.env"
}

measure() {
    mkdir -p "$OUT"
    rm -f "$OUT"/*.json "$OUT"/*.cpu "$OUT"/*.err "$OUT"/*.log \
        "$OUT"/*.txt "$OUT"/*.samples "$OUT"/*.env
    TMP=$(mktemp -d "${TMPDIR:-/tmp}/loom-servebench.XXXXXX")
    PIDS=""
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    HZ=$(getconf CLK_TCK)
    STREAMS_KEYS="" NOFILE_SOFT="" NOFILE_HARD="" LOOMS_PORT="" LOOMS_PID=""
    build
    set_priority
    start_fakes
    start_loom
    start_portkey
    start_nginx
    smoke
    idle_cpu
    scenarios
    save_run
}

# Stops every process this script started, by pid: SIGCONT (loadgen may
# have left one paused if it was killed), SIGTERM, up to 10 s, SIGKILL;
# then removes the temporary folder.
cleanup() {
    if [ -n "${NGINX_PID:-}" ]; then
        kill -CONT "-$NGINX_PID" 2>/dev/null || true
    fi
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

# ======================================================================
# Reporting (from bench/serve/out only)
# ======================================================================

# get FILE TARGET KEY: a number from loadgen's JSON line for TARGET.
get() {
    grep "^{\"target\":\"$2\"" "$OUT/$1.json" 2>/dev/null |
        sed -n "s/.*\"$3\":\([-0-9.]*\).*/\1/p" | head -1
}

# us VALUE: µs, no decimals from 1000 on; plus: the same as " (+V µs)".
us() { awk -v v="$1" 'BEGIN { if (v == "") print "-";
    else if (v >= 1000 || v <= -1000) printf "%.0f µs", v;
    else printf "%.1f µs", v }'; }
ms() { awk -v v="$1" 'BEGIN { if (v == "") print "-";
    else printf "%.2f ms", v / 1000 }'; }
plus() { awk -v v="$1" 'BEGIN { if (v == "") print "";
    else if (v >= 1000 || v <= -1000) printf " (%+.0f µs)", v;
    else printf " (%+.1f µs)", v }'; }
rps() { awk -v v="$1" 'BEGIN { if (v == "") print "-";
    else printf "%.0f req/s", v }'; }
ratio() { awk -v v="$1" 'BEGIN { if (v == "") print "";
    else printf " (%.2fx)", v }'; }

# measured TARGET: whether a peer (nginx, portkey) was measured; loom is.
measured() {
    case $1 in
    nginx) [ -n "${NGINX_MEASURED:-}" ] ;;
    portkey) [ -n "$PORTKEY_MEASURED" ] ;;
    *) true ;;
    esac
}

# row LABEL FILE KEY ADDED-KEY FORMAT: one table row for every target.
row() {
    f=$2 k=$3 ak=$4 fmt=$5
    line="| $1 | $($fmt "$(get "$f" fake "$k")")"
    for t in loom nginx portkey; do
        if ! measured $t; then
            line="$line | not measured"
            continue
        fi
        v=$(get "$f" $t "$k")
        a=$(get "$f" $t "$ak")
        if [ "$fmt" = rps ]; then
            line="$line | $(rps "$v")$(ratio "$a")"
        else
            line="$line | $($fmt "$v")$(plus "$a")"
        fi
    done
    echo "$line |"
}

# cpu SCENARIO TARGET: the server's CPU µs per answered request.
cpu() {
    ticks=$(sed -n "s/^$2 //p" "$OUT/$1.cpu" 2>/dev/null)
    n=$(get "$1" "$2" answered)
    awk -v t="$ticks" -v n="$n" -v hz="$HZ" 'BEGIN {
        if (t == "" || n == "" || n == 0) print "-";
        else printf "%.0f µs", t / hz * 1e6 / n }'
}

cpurow() {
    line="| $1 | "
    for t in loom nginx portkey; do
        if measured $t; then
            line="$line | $(cpu "$2" $t)"
        else
            line="$line | not measured"
        fi
    done
    echo "$line |"
}

# verdict VALUE LIMIT: met when VALUE < LIMIT.
verdict() {
    awk -v v="$1" -v lim="$2" 'BEGIN {
        print ((v != "" && v + 0 < lim + 0) ? "met" : "**not met**") }'
}

# verdict_min VALUE FLOOR: "met" when VALUE is at least FLOOR.
verdict_min() {
    awk -v v="$1" -v lim="$2" 'BEGIN {
        print ((v != "" && v + 0 >= lim + 0) ? "met" : "**not met**") }'
}

# peak NAME COLUMN: the highest value of a column (2 RSS KB, 3 threads,
# 4 descriptors) in NAME's samples of the streams scenario.
peak() {
    awk -v n="$1" -v c="$2" '$1 == n && $c + 0 > m { m = $c + 0 }
        END { if (m != "") print m }' "$OUT/streams.samples" 2>/dev/null
}

# streams_figures T: sets S_* for target T of the streams scenario (S_KB,
# S_THREADS, S_FDS, S_CPU_US empty for the fake, which is not sampled);
# streams_section reads them through eval.
# shellcheck disable=SC2034
streams_figures() {
    S_DONE=$(get streams "$1" answered)
    S_UNFIN=$(get streams "$1" unfinished)
    S_ERR=$(get streams "$1" errors)
    S_OPEN=$(get streams "$1" max_inflight)
    S_LAT50=$(get streams "$1" lat_p50_us)
    S_LAT99=$(get streams "$1" lat_p99_us)
    S_TTFT99=$(get streams "$1" ttft_p99_us)
    S_GAP50=$(get streams "$1" gap_p50_us)
    S_GAP99=$(get streams "$1" gap_p99_us)
    S_AGAP99=$(get streams "$1" added_gap_p99_us)
    S_FIRST_ERROR=$(grep "^{\"target\":\"$1\"" "$OUT/streams.json" \
        2>/dev/null | sed -n 's/.*"first_error":"\(.*\)"}$/\1/p' | head -1)
    S_KB="" S_THREADS="" S_FDS="" S_CPU_US=""
    if [ "$1" = fake ]; then
        # The fake serves every target's streams: its CPU over all chunks.
        ticks=$(sed -n 's/^fake //p' "$OUT/streams.cpu" 2>/dev/null)
        chunks=0
        for tg in fake loom portkey; do
            n=$(get streams $tg chunks_total)
            chunks=$((chunks + ${n:-0}))
        done
        S_CPU_US=$(awk -v t="$ticks" -v c="$chunks" -v hz="$HZ" 'BEGIN {
            if (t != "" && c > 0) printf "%.1f", t / hz * 1e6 / c }')
        return 0
    fi
    base=$(awk -v n="base-$1" '$1 == n { print $2 }' "$OUT/streams.samples" \
        2>/dev/null)
    S_THREADS=$(peak "$1" 3)
    S_FDS=$(peak "$1" 4)
    # At the sample with the most client connections open (the highest
    # RSS among those): growth / those connections. (The highest RSS of
    # all may come as streams end, when fewer are open than were: the
    # memory of ended streams is kept by malloc for the next ones.)
    S_KB=$(awk -v n="$1" -v b="$base" '$1 == n && $5 > 0 &&
            ($5 + 0 > c || ($5 + 0 == c && $2 + 0 > m)) {
            m = $2 + 0; c = $5 + 0 }
        END { if (m != "" && b != "" && c > 0) printf "%.1f", (m - b) / c }' \
        "$OUT/streams.samples" 2>/dev/null)
    ticks=$(sed -n "s/^$1 //p" "$OUT/streams.cpu" 2>/dev/null)
    chunks=$(get streams "$1" chunks_total)
    S_CPU_US=$(awk -v t="$ticks" -v c="$chunks" -v hz="$HZ" 'BEGIN {
        if (t != "" && c > 0) printf "%.1f", t / hz * 1e6 / c }')
}

# cell VALUE [UNIT]: VALUE UNIT, or "-" when there is no value.
cell() { if [ -n "$1" ]; then echo "$1${2:+ $2}"; else echo "-"; fi; }

# streams_section: the open-streams scenario's table and goals; also
# writes out/streams-loom.env, loom's figures, which become the "before"
# column once copied to bench/serve/streams-before.env.
# shellcheck disable=SC2154
streams_section() {
    [ -f "$OUT/streams.json" ] || return 0
    B_DONE=""
    if [ -f "$HERE/streams-before.env" ]; then
        # shellcheck disable=SC1091
        . "$HERE/streams-before.env"
    fi
    for t in fake loom portkey; do
        streams_figures $t
        for v in DONE UNFIN ERR OPEN LAT50 LAT99 TTFT99 GAP50 GAP99 AGAP99 \
            KB THREADS FDS CPU_US FIRST_ERROR; do
            eval "${t}_$v=\$S_$v"
        done
    done
    {
        echo "B_COMMIT=$(quote "$COMMIT")"
        echo "B_DATE=$(quote "$RUN_DATE")"
        echo "B_STREAMS=$(quote "$STREAMS")"
        for v in DONE UNFIN ERR OPEN LAT50 LAT99 TTFT99 GAP50 GAP99 AGAP99 \
            KB THREADS FDS CPU_US FIRST_ERROR; do
            eval "echo \"B_$v=\$(quote \"\$loom_$v\")\""
        done
    } >"$OUT/streams-loom.env"
    pk() { if [ -n "$PORTKEY_MEASURED" ]; then echo "$1"; else
        echo "not measured"; fi; }
    bcol() { [ -n "$B_DONE" ] && echo " $1 |"; }
    echo "## $STREAMS open streams"
    echo
    echo "$STREAMS streaming requests at once (opened $OPEN_PER_MS a"
    echo "millisecond), each answered by the fake with $STREAM_CHUNKS text"
    echo "chunks and $STREAM_MS ms before every chunk (the role chunk, each"
    echo "text chunk, the finish chunk and \`[DONE]\`): about"
    echo "$(awk -v c="$STREAM_CHUNKS" -v m="$STREAM_MS" \
        'BEGIN { printf "%.1f", (c + 3) * m / 1000 }') s per stream. Each"
    echo "target in turn (the others paused), each cut after $STREAMS_CAP s:"
    echo "what still runs then is *unfinished*. loom serve here is a second"
    echo "instance that serves only this scenario."
    echo
    hdr="| | fake direct | loom serve |"
    sep="|---|---:|---:|"
    if [ -n "$B_DONE" ]; then
        hdr="$hdr loom serve before ($B_COMMIT) |"
        sep="$sep---:|"
    fi
    echo "$hdr Portkey gateway |"
    echo "$sep---:|"
    # srow LABEL VAR UNIT [FORMAT] (f, l, p, b are set through eval)
    # shellcheck disable=SC2154
    srow() {
        fmt=${4:-cell}
        eval "f=\$fake_$2 l=\$loom_$2 p=\$portkey_$2 b=\${B_$2:-}"
        echo "| $1 | $($fmt "$f" "$3") | $($fmt "$l" "$3") |$(bcol \
            "$($fmt "$b" "$3")") $(pk "$($fmt "$p" "$3")") |"
    }
    msc() { awk -v v="$1" 'BEGIN { if (v == "") print "-";
        else printf "%.2f s", v / 1e6 }'; }
    srow "completed" DONE ""
    srow "unfinished at the cap" UNFIN ""
    srow "failed" ERR ""
    srow "most streams open at once" OPEN ""
    srow "whole stream p50" LAT50 "" msc
    srow "whole stream p99" LAT99 "" msc
    srow "first token p99" TTFT99 "" msc
    srow "gap between chunks p50" GAP50 "" ms
    srow "gap between chunks p99" GAP99 "" ms
    srow "added gap p99 (vs fake direct)" AGAP99 "" us
    srow "server memory per open stream (RSS growth / streams, most open)" KB KB
    srow "server threads at peak" THREADS ""
    srow "server open descriptors at peak" FDS ""
    srow "server CPU per chunk" CPU_US µs
    echo
    for t in loom portkey; do
        eval "e=\$${t}_FIRST_ERROR"
        [ -n "$e" ] && echo "- First failure ($t): \`$e\`."
    done
    echo "- Memory per open stream: the server's RSS at its highest sample"
    echo "  with clients connected, minus its RSS before the scenario,"
    echo "  divided by the client connections it held then (\`ss\`); samples every"
    echo "  0.5 s (\`/proc/PID/status\`, \`/proc/PID/fd\`). Most streams"
    echo "  open at once: as the load generator counts them (sent, not yet"
    echo "  answered, accepted or not). CPU per chunk: its user + system time over"
    echo "  the scenario divided by the content chunks its clients got (for"
    echo "  the fake: over every target's chunks, since it serves them all)."
    echo "- Gap between chunks: for every content chunk after a stream's"
    echo "  first, the time since the previous one at the client; \"added\""
    echo "  is loom's (or Portkey's) p99 minus the fake direct's."
    echo "- loom serve for this scenario: $STREAMS_KEYS."
    echo "- Open files here: soft limit $NOFILE_SOFT, hard $NOFILE_HARD. A"
    echo "  gateway holds two descriptors per stream (client and upstream),"
    echo "  so at most about $(( (NOFILE_HARD - 64) / 2 )) streams fit"
    echo "  through loom or Portkey on this machine however it is built."
    echo
    echo "Goals (issue 17):"
    echo
    all=$(awk -v d="$loom_DONE" -v n="$STREAMS" 'BEGIN {
        print (d == n ? "met" : "**not met**") }')
    echo "- All $STREAMS streams complete: $(cell "$loom_DONE") of $STREAMS:"
    echo "  $all."
    echo "- Memory per open stream under $KB_GOAL KB: $(cell "$loom_KB" KB):"
    echo "  $(verdict "$loom_KB" "$KB_GOAL")."
    echo "- Threads bounded by configuration, not by runs (under"
    echo "  $THREADS_GOAL with $STREAMS streams): $(cell "$loom_THREADS"):"
    echo "  $(verdict "$loom_THREADS" "$THREADS_GOAL")."
    # The added gap means something only when the fake direct kept its
    # own pace (median gap within 10% of STREAM_MS).
    paced=$(awk -v g="$fake_GAP50" -v ms="$STREAM_MS" 'BEGIN {
        print (g != "" && g <= ms * 1100 ? 1 : 0) }')
    echo "- Added time per chunk under $GAP_GOAL µs at p99 (the goal is"
    echo "  set at concurrency 1; here it says how far behind the fake's"
    echo "  pace the load leaves loom):"
    if [ "$paced" = 1 ]; then
        echo "  $(us "$loom_AGAP99"): $(verdict "$loom_AGAP99" "$GAP_GOAL")."
    else
        echo "  not measurable in this run: the fake direct's own chunks"
        echo "  came $(ms "$fake_GAP50") apart at the median instead of"
        echo "  $STREAM_MS ms (the fake, the load generator or the machine"
        echo "  could not keep up), so no gap here is loom's alone."
    fi
    echo "- CPU per chunk (reported, no goal): $(cell "$loom_CPU_US" µs);"
    echo "  the fake's own, for each chunk it sends: $(cell "$fake_CPU_US" µs)."
    echo
}

# classic_section: the side-by-side table of the classic scenarios and
# their goals.
classic_section() {
    echo "## Side by side"
    echo
    echo "Same fake upstream binary, same requests, one load generator,"
    echo "one run. In brackets: \"added\" = the target's figure minus the"
    echo "fake direct's for the same percentile in the same run, and"
    echo "throughput relative to the fake direct's."
    echo
    echo "| | fake direct | loom serve | nginx (relays, stores nothing) | Portkey gateway |"
    echo "|---|---:|---:|---:|---:|"
    row "c=1, not streamed: latency p50" c1 lat_p50_us \
        added_lat_p50_us us
    row "c=1, not streamed: latency p99" c1 lat_p99_us \
        added_lat_p99_us us
    row "c=1, streamed: latency p50" c1-stream lat_p50_us \
        added_lat_p50_us us
    row "c=1, streamed: latency p99" c1-stream lat_p99_us \
        added_lat_p99_us us
    row "c=1, streamed: first token p50" c1-stream ttft_p50_us \
        added_ttft_p50_us us
    row "c=1, streamed: first token p99" c1-stream ttft_p99_us \
        added_ttft_p99_us us
    row "c=$C, not streamed: throughput" c64 rps rps_vs_baseline rps
    row "c=$C, streamed: throughput" c64-stream rps rps_vs_baseline rps
    row "c=$C, not streamed: latency p50" c64 lat_p50_us \
        added_lat_p50_us us
    row "c=$C, not streamed: latency p99" c64 lat_p99_us \
        added_lat_p99_us us
    row "$CHUNKS chunks $CHUNK_MS ms apart: first token p50" ttft \
        ttft_p50_us added_ttft_p50_us us
    row "$CHUNKS chunks $CHUNK_MS ms apart: first token p99" ttft \
        ttft_p99_us added_ttft_p99_us us
    row "$CHUNKS chunks $CHUNK_MS ms apart: whole stream p50" ttft \
        lat_p50_us added_lat_p50_us ms
    row "$CHUNKS chunks $CHUNK_MS ms apart: gap between chunks p99" ttft \
        gap_p99_us added_gap_p99_us us
    cpurow "server CPU per request, c=1 not streamed" c1
    cpurow "server CPU per request, c=$C not streamed" c64
    echo
    echo "- Requests: c=1: $N measured per target after $WARMUP warm-up,"
    echo "  in $ROUNDS blocks alternating between the targets; c=$C:"
    echo "  every connection busy for $DURATION s (after $TP_WARMUP s"
    echo "  unmeasured), one target after the other; long stream: $TTFT_N"
    echo "  streams per target at c=1 (so its p99 is the" \
        "$(awk -v n="$TTFT_N" 'BEGIN { k = int(0.99 * n);
            if (k < 0.99 * n) k++; print k }')th of $TTFT_N"
    echo "  from the fastest)."
    echo "- Short answer: \"$SHORT_TEXT\" in two chunks, no delay. Long"
    echo "  stream: $CHUNKS text chunks, $CHUNK_MS ms before every chunk,"
    echo "  so the fake's own first token comes after two delays (role"
    echo "  chunk, first text chunk)."
    echo "- Gap between chunks: for every content chunk of a long stream"
    echo "  after its first, the time since the one before (chunks read"
    echo "  together: 0); its added p99 is loom's p99 minus the fake's,"
    echo "  the time loom adds to a chunk beyond the fake's own pace."
    echo "- First token = the first SSE chunk with non-empty"
    echo "  \`content\`; loom's role chunk (\`\"content\": \"\"\`) does"
    echo "  not count."
    echo "- Server CPU per request: the server's user + system CPU time"
    echo "  over the scenario (it is paused while the other targets are"
    echo "  measured) divided by all the answers it gave, warm-up"
    echo "  included, at the resolution of clock ticks (1/$HZ s)."
    idle="loom serve $LOOM_IDLE%"
    [ -n "$PORTKEY_IDLE" ] && idle="$idle, Portkey $PORTKEY_IDLE%"
    echo "- Server CPU while idle (2 s before the scenarios, % of one"
    echo "  core): $idle."
    echo
    echo "## Goals"
    echo
    echo "Issue 17's (the open-streams goals are in their section):"
    echo
    echo "- Pass-through at c=$C, not streamed, stored: at least 15,000"
    echo "  req/s: $(rps "$L_RPS"): $(verdict_min "$L_RPS" 15000)."
    if [ -n "${NGINX_MEASURED:-}" ]; then
        N_RPS=$(get c64 nginx rps)
        echo "  nginx, which stores nothing and parses no body, in front of"
        echo "  the same fake in the same run: $(rps "$N_RPS"), at"
        echo "  $(cpu c64 nginx) of CPU a request; loom serves"
        echo "  $(awk -v l="$L_RPS" -v n="$N_RPS" 'BEGIN {
            if (l != "" && n != "" && n > 0) printf "%.2fx", l / n;
            else print "-" }') of nginx's throughput."
    fi
    echo "- Added latency at concurrency 1, p50 under 150 µs: not"
    echo "  streamed $(us "$L_P50"): $(verdict "$L_P50" 150); streamed"
    echo "  $(us "$L_P50S"): $(verdict "$L_P50S" 150)."
    echo "- Added latency at concurrency 1, p99 under 1 ms: not"
    echo "  streamed $(us "$L_P99"): $(verdict "$L_P99" 1000); streamed"
    echo "  $(us "$L_P99S"): $(verdict "$L_P99S" 1000)."
    if [ -n "${NGINX_MEASURED:-}" ]; then
        echo "  nginx, in front of the same fake, adds $(us "$(get c1 nginx \
            added_lat_p50_us)") at p50 and $(us "$(get c1 nginx \
            added_lat_p99_us)") at p99"
        echo "  not streamed, $(us "$(get c1-stream nginx \
            added_lat_p50_us)") and $(us "$(get c1-stream nginx \
            added_lat_p99_us)") streamed."
    fi
    echo "- A slow stream ($CHUNKS chunks $CHUNK_MS ms apart) within 2 ms"
    echo "  of the fake end to end, p50: $(us "$L_WHOLE50"):"
    echo "  $(verdict "$L_WHOLE50" 2000)."
    echo "- Added time per chunk under 100 µs at p99 (the same stream):"
    echo "  $(us "$L_GAP99"): $(verdict "$L_GAP99" 100)."
    echo
    echo "The first serve benchmark's:"
    echo
    echo "- Added latency p99 under 200 µs at concurrency 1: not"
    echo "  streamed $(us "$L_P99"): $(verdict "$L_P99" 200); streamed"
    echo "  $(us "$L_P99S"): $(verdict "$L_P99S" 200)."
    echo "- No added time to first token beyond 1 ms ($CHUNKS chunks"
    echo "  $CHUNK_MS ms apart): p50 $(us "$L_TTFT50"):"
    echo "  $(verdict "$L_TTFT50" 1000); p99 $(us "$L_TTFT99"):"
    echo "  $(verdict "$L_TTFT99" 1000)."
    echo
}

write_results() {
    [ -f "$OUT/run.env" ] || fail "no $OUT/run.env: run without REPORT_ONLY"
    # shellcheck disable=SC1091
    . "$OUT/run.env"
    CPU_MODEL=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
    CPU_FAMILY=$(lscpu | sed -n 's/^CPU family: *//p' | head -1)
    CPU_MODELNO=$(lscpu | sed -n 's/^Model: *//p' | head -1)
    HYPERVISOR=$(lscpu | sed -n 's/^Hypervisor vendor: *//p' | head -1)
    MEM=$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' \
        /proc/meminfo)
    # shellcheck disable=SC1091,SC2015
    OS=$(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME" || uname -s)
    MHDV=$(pkg-config --modversion libmicrohttpd 2>/dev/null || echo "?")
    CURLV=$(pkg-config --modversion libcurl 2>/dev/null || echo "?")
    SQLITEV=$(pkg-config --modversion sqlite3 2>/dev/null || echo "?")
    L_P50=$(get c1 loom added_lat_p50_us)
    L_P50S=$(get c1-stream loom added_lat_p50_us)
    L_RPS=$(get c64 loom rps)
    L_P99=$(get c1 loom added_lat_p99_us)
    L_P99S=$(get c1-stream loom added_lat_p99_us)
    L_TTFT50=$(get ttft loom added_ttft_p50_us)
    L_TTFT99=$(get ttft loom added_ttft_p99_us)
    L_WHOLE50=$(get ttft loom added_lat_p50_us)
    L_GAP99=$(get ttft loom added_gap_p99_us)
    say "writing $RESULTS"
    {
        echo "# loom serve as a pass-through: results"
        echo
        echo "Written by \`sh bench/serve.sh\` on $RUN_DATE, commit"
        echo "$COMMIT. What is measured and how:"
        echo "[serve/README.md](serve/README.md)."
        echo
        echo "## Machine"
        echo
        echo "| | |"
        echo "|---|---|"
        echo "| CPU | $CPU_MODEL (family $CPU_FAMILY, model" \
            "$CPU_MODELNO)${HYPERVISOR:+, $HYPERVISOR guest} |"
        echo "| cores | $(nproc) |"
        echo "| memory | $MEM |"
        echo "| OS, kernel | $OS, Linux $(uname -r) |"
        echo "| compiler | $CCV, Release (\`$CFLAGS_USED\`) |"
        echo "| libraries | libmicrohttpd $MHDV, libcurl $CURLV," \
            "SQLite $SQLITEV |"
        echo "| node | $NODE_VERSION${PK_INSTALLED:+ ($PK_INSTALLED)} |"
        echo "| nginx | ${NGINX_VERSION:-not used} |"
        echo "| load average | $LOAD_BEFORE before, $LOAD_AFTER after |"
        echo "| priority | $NICE_NOTE |"
        echo
        echo "Everything (load generator, fakes, loom, nginx, Portkey) shares these"
        echo "$(nproc) cores, and the machine is shared with other work, so"
        echo "the figures are noisy, p99 most. They are one run's, not the"
        echo "best of several."
        echo
        if [ -f "$OUT/c1.json" ]; then
            classic_section
        fi
        streams_section
        echo "## Setup"
        echo
        echo "- loom serve: providers \`fake\` and \`fake64\` (kind openai,"
        echo "  retries 0) pointing at the two fakes; requests name"
        echo "  \`fake/fake-model\` (\`fake64/fake-model\` for the long"
        echo "  stream) and no tools, so each is one run with one model call,"
        echo "  whose turn is stored (a fresh SQLite file on disk)."
        echo "  \`max_concurrent_runs: 1024\`, \`max_connections: 4096\`,"
        echo "  \`--log-level warn\`: no log line per request."
        echo "- Portkey: \`node --import ./portkey-localhost.mjs"
        echo "  node_modules/@portkey-ai/gateway/build/start-server.js"
        echo "  --port=0 --headless\`, \`NODE_ENV=production\`; the preload"
        echo "  only makes it listen on 127.0.0.1 and report its port."
        echo "  Headers \`x-portkey-provider: openai\`,"
        echo "  \`x-portkey-custom-host: http://127.0.0.1:PORT/v1\`; model"
        echo "  \`fake-model\`. Pinned in bench/serve/package-lock.json:"
        echo "  @portkey-ai/gateway $PORTKEY_VERSION, @hono/node-server"
        echo "  $HONO_NODE_VERSION (npm \`overrides\`)."
        echo "- nginx: \`nginx-light\` from Debian as a plain reverse proxy"
        echo "  in front of the same fakes (\`/short/\` and \`/long/\`), two"
        echo "  workers, keep-alive to the client and to the fake"
        echo "  (\`proxy_http_version 1.1\`, \`keepalive 256\`), no"
        echo "  buffering, no access log; model \`fake-model\`. It parses no"
        echo "  body and stores nothing: what any relay costs on this machine"
        echo "  at the least. Its CPU is its master's and workers' together."
        echo "  Not in the open-streams scenario."
        echo "- Fake direct: the same requests straight to the fake, model"
        echo "  \`fake-model\`. loom, nginx and Portkey pass \`stream\` on as"
        echo "  the client sent it (loom asks the model for a stream when the"
        echo "  client asked for one, for the whole answer otherwise)."

        echo "- Every response is checked (status 200, the exact answer"
        echo "  text, \`[DONE]\` at the end of a stream); one failure stops"
        echo "  the benchmark."
        echo "- Each server is paused (SIGSTOP) while another target is"
        echo "  measured, so its background work cannot slow the others."
        if [ -n "$PORTKEY_NOTE" ]; then
            echo "- $PORTKEY_NOTE"
        fi
        if [ -n "${NGINX_NOTE:-}" ]; then
            echo "- $NGINX_NOTE"
        fi
        echo
        echo "## Reproduce"
        echo
        echo '```sh'
        echo "sh bench/serve.sh                 # everything, writes this file"
        echo "N=500 TTFT_N=20 DURATION=5 sh bench/serve.sh  # quicker"
        echo "PORTKEY=0 NGINX=0 sh bench/serve.sh  # loom and the fake only"
        echo "REPORT_ONLY=1 sh bench/serve.sh   # rewrite this file from out/"
        echo '```'
        echo
        echo "Raw results: bench/serve/out/*.json, one line per target and"
        echo "scenario with every percentile."
    } >"$RESULTS"
    say "done: $RESULTS"
    sed -n '/^## Side by side/,/^## Setup/p' "$RESULTS" >&2
}

if [ "${REPORT_ONLY:-0}" != 1 ]; then
    measure
fi
write_results

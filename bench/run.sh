#!/bin/sh
# Runs loom's loop benchmark and its peers side by side and writes
# bench/RESULTS.md (see bench/README.md for what is measured).
#
#   sh bench/run.sh
#
# Steps: a Release build of loom-bench and loom-fake-upstream in its own
# build directory; loom-bench (RUNS measured runs); the callgrind
# instruction count (two run counts, difference); `npm ci` and the peers in
# bench/peers against the same fake and the same script (skipped, with a
# message, when node or npm is missing); then RESULTS.md. Raw outputs stay
# in bench/out/ (ignored by git).
#
# Then the fan-out (`loom-bench fanout`: a parent calling 8 sub-agents of
# 3 model calls each, and one such worker alone through the same session
# path): timed runs, callgrind at two run counts, and the peak heap per
# child run from loom-bench-mem; its section of RESULTS.md compares it
# with the single-agent loop measured just before.
#
# Then a whole research run (bench/research.sh, `loom-bench research`: 8
# cycles x 5 researchers x 3 search rounds): loom's CPU time and peak
# memory, its own section of RESULTS.md.
#
# Environment: RUNS (default 1000), PEER_RUNS (default RUNS), WARMUP
# (default 50), CG_LO / CG_HI (callgrind run counts, default 20 / 120),
# FAN_RUNS (fan-out timed runs, default 200), FAN_CG_LO / FAN_CG_HI
# (fan-out callgrind run counts, default 5 / 25),
# LOOM_BENCH_BUILD (build directory, default build-bench), RESULTS (output
# file, default bench/RESULTS.md), PEERS=0 to leave the peers out.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${LOOM_BENCH_BUILD:-$ROOT/build-bench}
OUT=$ROOT/bench/out
RESULTS=${RESULTS:-$ROOT/bench/RESULTS.md}
RUNS=${RUNS:-1000}
PEER_RUNS=${PEER_RUNS:-$RUNS}
WARMUP=${WARMUP:-50}
CG_LO=${CG_LO:-20}
CG_HI=${CG_HI:-120}
FAN_RUNS=${FAN_RUNS:-200}
FAN_CG_LO=${FAN_CG_LO:-5}
FAN_CG_HI=${FAN_CG_HI:-25}
BENCH=$BUILD/loom-bench
FAKE=$BUILD/loom-fake-upstream

say() { echo "bench: $*" >&2; }

mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.err "$OUT"/*.txt "$OUT"/cg.* "$OUT"/fan-*

# ---- build: Release, with symbols so callgrind can name functions ----
say "building (Release) in $BUILD"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS=-g \
    -DLOOM_TESTS=OFF >"$OUT/build.log" 2>&1 ||
    { cat "$OUT/build.log" >&2; exit 1; }
cmake --build "$BUILD" --target loom-bench loom-bench-mem loom-fake-upstream -j2 \
    >>"$OUT/build.log" 2>&1 || { cat "$OUT/build.log" >&2; exit 1; }
CC_PATH=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
CFLAGS_USED="$(sed -n 's/^CMAKE_C_FLAGS_RELEASE:[A-Z]*=//p' \
    "$BUILD/CMakeCache.txt") -g"

"$BENCH" --print-script >"$OUT/script.json"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- loom ----
say "loom: $RUNS runs after $WARMUP warm-up"
"$BENCH" --fake "$FAKE" --runs "$RUNS" --warmup "$WARMUP" --json \
    >"$OUT/loom.json"
"$BENCH" --table "$OUT/loom.json" >&2

# ---- peers ----
PEER_FILES=""
PEER_NOTES=""
NODE_VERSION="not used"
if [ "${PEERS:-1}" = 0 ]; then
    say "peers skipped: PEERS=0"
    PEER_NOTES="
- Peers skipped (PEERS=0): this table is not a comparison."
elif command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
    NODE_VERSION=$(node --version)
    say "peers: npm ci"
    if (cd "$ROOT/bench/peers" &&
        npm ci --no-audit --no-fund >"$OUT/npm-ci.log" 2>&1); then
        for peer in agents ai-sdk; do
            say "peer $peer: $PEER_RUNS runs after $WARMUP warm-up"
            if node "$ROOT/bench/peers/$peer.mjs" --fake "$FAKE" \
                --script "$OUT/script.json" --runs "$PEER_RUNS" \
                --warmup "$WARMUP" >"$OUT/$peer.json" 2>"$OUT/$peer.err"
            then
                PEER_FILES="$PEER_FILES $OUT/$peer.json"
            else
                say "peer $peer failed: $(tail -3 "$OUT/$peer.err")"
                PEER_NOTES="$PEER_NOTES
- The \`$peer\` peer failed in this run; its error:
  \`$(tail -1 "$OUT/$peer.err")\`"
            fi
        done
    else
        say "peers skipped: npm ci failed (see $OUT/npm-ci.log)"
        PEER_NOTES="
- Peers skipped: \`npm ci\` failed in bench/peers:
  \`$(tail -1 "$OUT/npm-ci.log")\`"
    fi
else
    NODE_VERSION="not installed"
    say "peers skipped: node and npm are needed for bench/peers"
    PEER_NOTES="
- Peers skipped: node and npm are not installed on this machine."
fi

# ---- callgrind: instructions per model call, start-up cancelled out ----
CG_NOTE=""
IR_CALL=""
IR_RUN=""
if command -v valgrind >/dev/null 2>&1; then
    for n in "$CG_LO" "$CG_HI"; do
        say "callgrind: $n runs"
        valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.$n.out" \
            "$BENCH" --fake "$FAKE" --iterations-only --runs "$n" \
            --warmup "$WARMUP" >"$OUT/cg.$n.log" 2>&1
    done
    totals() {
        awk '/^totals:/ { print $2; exit } /^summary:/ { s = $2 }
             END { if (s) print s }' "$1" | head -1
    }
    IR_LO=$(totals "$OUT/cg.$CG_LO.out")
    IR_HI=$(totals "$OUT/cg.$CG_HI.out")
    CALLS=$(sed -n 's/.*"model_calls_per_run":\([0-9]*\).*/\1/p' \
        "$OUT/loom.json")
    IR_RUN=$(awk -v a="$IR_LO" -v b="$IR_HI" -v n=$((CG_HI - CG_LO)) \
        'BEGIN { printf "%.0f", (b - a) / n }')
    IR_CALL=$(awk -v r="$IR_RUN" -v c="$CALLS" \
        'BEGIN { printf "%.0f", r / c }')
    # Where the instructions go: every function's cost in the larger
    # profile minus its cost in the smaller one, per model call, so
    # start-up (dynamic linking, curl_global_init) drops out here too.
    # $1 $2: the smaller and the larger profile (names in bench/out), $3:
    # the denominator (runs between them x model calls), $4: "" for self
    # cost, "--inclusive=yes" for inclusive cost.
    # callgrind_annotate runs from bench/out: it shortens paths under its
    # working directory in some places only, which would split functions.
    # For the same reason "build-bench/../src" becomes "src", and the
    # costs of names made the same are added.
    fn_diff() {
        for f in "$1" "$2"; do
            # shellcheck disable=SC2086
            (cd "$OUT" && callgrind_annotate --auto=no --threshold=100 $4 \
                "$f" 2>/dev/null) |
                sed -n -E 's/^ *([0-9,]+) +\( *[0-9.]+%\) +(.*)$/\1\t\2/p' |
                tr -d ',' | sed -E 's#[^/[:space:]]+/\.\./##g' |
                awk -F'\t' '{ s[$2] += $1 } END { for (k in s) print s[k] "\t" k }' \
                    >"$OUT/$f.fn"
        done
        awk -F'\t' -v den="$3" '
            NR == FNR { lo[$2] = $1; next }
            { d = ($1 - lo[$2]) / den }
            d >= 1 { printf "%9.0f  %s\n", d, $2 }
        ' "$OUT/$1.fn" "$OUT/$2.fn" | sort -rn |
            sed "s|$ROOT/||g; s|\[[^]]*/|[|"
    }
    per_call() {
        fn_diff "cg.$CG_LO.out" "cg.$CG_HI.out" $(((CG_HI - CG_LO) * CALLS)) \
            "$1"
    }
    per_call "" | grep -v "PROGRAM TOTALS" | head -20 >"$OUT/hot-self.txt"
    # Code inlined from a header shows again as header.h:caller; its cost
    # is inside the caller's line already.
    per_call --inclusive=yes |
        grep -v "???:0x\|(below main)\|:main\b\|:run_once\b\|PROGRAM TOTALS" |
        grep -v "ld-linux\|libc_start\|\.h:" | head -30 >"$OUT/hot-incl.txt"
else
    CG_NOTE="valgrind is not installed: no instruction count."
fi

# ---- the fan-out: a parent and 8 sub-agents, and one worker alone ----
say "fan-out: $FAN_RUNS runs after $((WARMUP / 5)) warm-up"
"$BENCH" fanout --fake "$FAKE" --runs "$FAN_RUNS" --warmup $((WARMUP / 5)) \
    --json >"$OUT/fan-fanout.json"
"$BENCH" fanout --single --fake "$FAKE" --runs "$FAN_RUNS" \
    --warmup $((WARMUP / 5)) --json >"$OUT/fan-single.json"
# Each run's peak heap above what was live before it, 8 children and 0
# (the parent answering at once), from the heap-counting build.
for n in 8 1 0; do
    "$BUILD/loom-bench-mem" fanout --fake "$FAKE" --memory --children "$n" \
        --runs 50 --warmup 5 --json >"$OUT/fan-mem-$n.json"
done
jnum() { # $1 file, $2 key, $3 sub-key: the number there, to 0.1
    sed -n "s/.*\"$2\":{[^}]*\"$3\":\([0-9.]*\).*/\1/p" "$1" |
        awk '{ printf "%.1f", $1 }'
}
FAN_CPU=$(jnum "$OUT/fan-fanout.json" cpu_us_per_call mean)
FAN_SINGLE_CPU=$(jnum "$OUT/fan-single.json" cpu_us_per_call mean)
FAN_WALL=$(jnum "$OUT/fan-fanout.json" per_run p50)
FAN_COUNTING=$(sed -n 's/.*"token_counting":"\([^"]*\)".*/\1/p' \
    "$OUT/fan-fanout.json")
LOOP_CPU=$(jnum "$OUT/loom.json" cpu_us_per_call mean)
MEM8=$(jnum "$OUT/fan-mem-8.json" heap_peak_bytes_per_run p50)
MEM1=$(jnum "$OUT/fan-mem-1.json" heap_peak_bytes_per_run p50)
MEM0=$(jnum "$OUT/fan-mem-0.json" heap_peak_bytes_per_run p50)
FAN_IR_CALL=""
if command -v valgrind >/dev/null 2>&1; then
    for mode in fanout single; do
        flag=""
        [ "$mode" = single ] && flag=--single
        for n in "$FAN_CG_LO" "$FAN_CG_HI"; do
            say "callgrind: $mode, $n runs"
            # shellcheck disable=SC2086
            valgrind --tool=callgrind \
                --callgrind-out-file="$OUT/fan-cg.$mode.$n.out" \
                "$BENCH" fanout $flag --fake "$FAKE" --iterations-only \
                --runs "$n" --warmup 5 >"$OUT/fan-cg.$mode.$n.log" 2>&1
        done
    done
    fan_ir() { # $1 mode, $2 model calls per run: Ir per model call
        lo=$(totals "$OUT/fan-cg.$1.$FAN_CG_LO.out")
        hi=$(totals "$OUT/fan-cg.$1.$FAN_CG_HI.out")
        awk -v a="$lo" -v b="$hi" -v n=$((FAN_CG_HI - FAN_CG_LO)) -v c="$2" \
            'BEGIN { printf "%.0f", (b - a) / n / c }'
    }
    FAN_CALLS=$(sed -n 's/.*"model_calls_per_run":\([0-9]*\).*/\1/p' \
        "$OUT/fan-fanout.json")
    SINGLE_CALLS=$(sed -n 's/.*"model_calls_per_run":\([0-9]*\).*/\1/p' \
        "$OUT/fan-single.json")
    FAN_IR_CALL=$(fan_ir fanout "$FAN_CALLS")
    SINGLE_IR_CALL=$(fan_ir single "$SINGLE_CALLS")
    # Where the fan-out's instructions go, inclusive, per model call.
    fn_diff "fan-cg.fanout.$FAN_CG_LO.out" "fan-cg.fanout.$FAN_CG_HI.out" \
        $(((FAN_CG_HI - FAN_CG_LO) * FAN_CALLS)) --inclusive=yes |
        grep -v "???:0x\|(below main)\|:main\b\|PROGRAM TOTALS" |
        grep -v "ld-linux\|libc_start\|\.h:\|start_thread\|clone\.S" |
        grep -v "fanout_bench\.c\|bench_util\.c" | head -30 >"$OUT/fan-hot-incl.txt"
fi

# ---- RESULTS.md ----
say "writing $RESULTS"
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
CPU_MODEL=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
CPU_FAMILY=$(lscpu | sed -n 's/^CPU family: *//p' | head -1)
CPU_MODELNO=$(lscpu | sed -n 's/^Model: *//p' | head -1)
HYPERVISOR=$(lscpu | sed -n 's/^Hypervisor vendor: *//p' | head -1)
MEM=$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
OS=$(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME" || uname -s)
CCV=$("$CC_PATH" --version | head -1)
CURLV=$(sed -n 's/.*"libcurl":"\([^"]*\)".*/\1/p' "$OUT/loom.json")
JANSSONV=$(sed -n 's/.*"jansson":"\([^"]*\)".*/\1/p' "$OUT/loom.json")
MHDV=$(pkg-config --modversion libmicrohttpd 2>/dev/null || echo "?")
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "?")
if [ -n "$(git -C "$ROOT" status --porcelain -- src include 2>/dev/null)" ]
then
    COMMIT="$COMMIT (the working tree had uncommitted changes under src/"
    COMMIT="$COMMIT or include/)"
fi

{
    echo "# loom loop benchmark: results"
    echo
    echo "Written by \`sh bench/run.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'),"
    echo "commit $COMMIT."
    echo "What is measured, and what \"iteration\" means, is in"
    echo "[README.md](README.md)."
    echo
    echo "## Machine"
    echo
    echo "| | |"
    echo "|---|---|"
    CPU="$CPU_MODEL (family $CPU_FAMILY, model $CPU_MODELNO)"
    echo "| CPU | $CPU${HYPERVISOR:+, $HYPERVISOR guest} |"
    echo "| cores | $(nproc) |"
    echo "| memory | $MEM |"
    echo "| OS, kernel | $OS, Linux $(uname -r) |"
    echo "| compiler | $CCV, Release (\`$CFLAGS_USED\`) |"
    echo "| libraries | libcurl $CURLV, jansson $JANSSONV (loom);" \
        "libmicrohttpd $MHDV (the fake) |"
    echo "| node | $NODE_VERSION |"
    echo "| load average | $LOAD_BEFORE before, $LOAD_AFTER after |"
    echo
    echo "The machine is shared and small (2 cores, loaded by other work),"
    echo "so the figures are noisy; p99 especially. They are what was"
    echo "measured, not a best of several runs."
    echo
    echo "## Loom's own time, beside its peers"
    echo
    echo "A run = 5 model calls that each ask for the no-op tool + 1 final"
    echo "answer = 6 model calls. Own time = wall time of the run minus the"
    echo "fake upstream's busy time for it; per model call = a run's own"
    echo "time / 6. Percentiles are over runs. All streaming, same fake"
    echo "binary, same script, same machine, one after the other."
    echo
    # shellcheck disable=SC2086
    "$BENCH" --table "$OUT/loom.json" $PEER_FILES
    echo
    echo "## Instructions (callgrind)"
    echo
    if [ -n "$IR_CALL" ]; then
        echo "**$IR_CALL instructions per model call** ($IR_RUN per run), loom"
        echo "and the libraries it calls (libcurl, jansson, libc) on loom's"
        echo "side of the socket: total Ir of \`loom-bench --iterations-only"
        echo "--runs $CG_HI\` minus that of \`--runs $CG_LO\`"
        echo "($IR_HI - $IR_LO), divided by $((CG_HI - CG_LO)) runs x $CALLS"
        echo "model calls, so start-up and warm-up cancel out. The fake runs"
        echo "outside valgrind."
        echo
        echo "Where they go, per model call (each function's Ir in the"
        echo "\`--runs $CG_HI\` profile minus the \`--runs $CG_LO\` one,"
        echo "divided the same way). Self cost, top 20. jansson's internal"
        echo "functions have no symbols on this machine (the inclusive list"
        echo "below shows the entry points that reach them); callgrind keys"
        echo "such \`???:0x...\` functions by offset alone, so one may show"
        echo "the name of another library that has code at the same offset."
        echo
        echo '```'
        echo "Ir/call  file:function [object]"
        cat "$OUT/hot-self.txt"
        echo '```'
        echo
        echo "Inclusive cost of named functions (loom's and the library entry"
        echo "points it calls), top 30:"
        echo
        echo '```'
        echo "Ir/call  file:function [object]"
        cat "$OUT/hot-incl.txt"
        echo '```'
    else
        echo "$CG_NOTE"
    fi
    echo
    echo "## Fan-out: a parent and 8 sub-agents"
    echo
    echo "\`loom-bench fanout\` (README.md, \"The fan-out\"): one turn of a"
    echo "session (a YAML config, no store) whose parent agent first asks"
    echo "for 8 calls of the \`worker\` sub-agent at once; each worker calls"
    echo "\`get_time\` twice, one call per model call, then answers; the"
    echo "parent then answers: 1 + 8 x 3 + 1 = $FAN_CALLS model calls and 24"
    echo "tool calls per run, all checked. \"Worker alone\" is one worker as"
    echo "the top turn: the same session path and agent, no sub-agent"
    echo "($SINGLE_CALLS model calls). The single-agent loop is the"
    echo "benchmark above, measured in this same run."
    echo
    echo "Each model call's prompt estimate (for the model's correction"
    echo "factor) was counted by \`$FAN_COUNTING\`: with a vocabulary"
    echo "(\`estimate:o200k_base\`) about 24k instructions per model call"
    echo "more than without one (\`estimate:length\`, vocab/data empty:"
    echo "\`sh scripts/vocab.sh\`); compare figures of the same kind only."
    echo
    if [ -n "$FAN_IR_CALL" ]; then
        echo "| | instructions per model call | vs the single-agent loop |" \
            "CPU µs per model call (mean) |"
        echo "|---|---:|---:|---:|"
        echo "| single-agent loop (loom_run, above) | $IR_CALL | 1.00x |" \
            "$LOOP_CPU |"
        echo "| worker alone (session turn) | $SINGLE_IR_CALL |" \
            "$(awk -v a="$SINGLE_IR_CALL" -v b="$IR_CALL" \
                'BEGIN { printf "%.2fx", a / b }') | $FAN_SINGLE_CPU |"
        echo "| fan-out (parent + 8 sub-agents) | $FAN_IR_CALL |" \
            "$(awk -v a="$FAN_IR_CALL" -v b="$IR_CALL" \
                'BEGIN { printf "%.2fx", a / b }') | $FAN_CPU |"
        echo
        echo "Target (issue 12): loom's own time per model call in the"
        echo "fan-out within 1.5x of the single-agent loop's. Own time is"
        echo "what the CPU column measures (the fake is another process):"
        echo "$FAN_CPU / $LOOP_CPU = $(awk -v a="$FAN_CPU" -v b="$LOOP_CPU" \
            'BEGIN { printf "%.2fx", a / b }'), **$(awk -v a="$FAN_CPU" \
            -v b="$LOOP_CPU" 'BEGIN { print (a / b <= 1.5 ? "met" : \
            "not met") }')**. Instructions, beside it:"
        echo "$(awk -v a="$FAN_IR_CALL" -v b="$IR_CALL" \
            'BEGIN { printf "%.2fx", a / b }'), **$(awk -v a="$FAN_IR_CALL" \
            -v b="$IR_CALL" 'BEGIN { print (a / b <= 1.5 ? "within" : \
            "not within") }') 1.5x**. The machine is shared and loaded, so"
        echo "the CPU figures move from run to run; the instruction counts"
        echo "are the stable measure."
        echo
        echo "The fan-out's instructions: total Ir of"
        echo "\`--iterations-only --runs $FAN_CG_HI\` minus \`--runs"
        echo "$FAN_CG_LO\`, divided by $((FAN_CG_HI - FAN_CG_LO)) runs x"
        echo "$FAN_CALLS model calls (the worker alone: x $SINGLE_CALLS)."
        echo "CPU: the process's CPU time (all threads) during a run /"
        echo "model calls, $FAN_RUNS runs; the children overlap, so wall time"
        echo "minus the fake's busy time is not loom's own time here (the"
        echo "fan-out's wall time per run, p50: $FAN_WALL µs, with 8 children"
        echo "in parallel on 2 cores)."
        echo
        echo "Where the fan-out's instructions go, inclusive, per model call"
        echo "(named functions, top 30):"
        echo
        echo '```'
        echo "Ir/call  file:function [object]"
        cat "$OUT/fan-hot-incl.txt"
        echo '```'
    else
        echo "$CG_NOTE CPU µs per model call (mean): single-agent loop"
        echo "$LOOP_CPU, worker alone $FAN_SINGLE_CPU, fan-out $FAN_CPU."
    fi
    echo
    echo "**Peak heap per child run: $(awk -v a="$MEM8" -v b="$MEM0" \
        'BEGIN { printf "%.1f KiB", (a - b) / 8 / 1024 }')** (one child alone:"
    echo "$(awk -v a="$MEM1" -v b="$MEM0" \
        'BEGIN { printf "%.1f KiB", (a - b) / 1024 }')). Method: the"
    echo "\`loom-bench-mem\` build counts every heap block (malloc and"
    echo "friends replaced, all threads, loom, libcurl and jansson alike);"
    echo "before each run the high-water mark is reset to what is live, so"
    echo "a run's peak is its own. p50 over 50 runs: $MEM8 bytes with 8"
    echo "children, $MEM1 with 1, $MEM0 with none (the parent answering at"
    echo "once); (8 children - none) / 8. The 8 children run at once, so"
    echo "their peaks add up. Not counted: each tool call's thread stack"
    echo "(mapped, not heap; a few touched pages each). Peak RSS cannot"
    echo "tell: the process's high-water mark is set at start-up (the"
    echo "tokenizer's vocabulary), not by the runs."
    echo
    echo "## Notes"
    echo
    echo "- loom: $RUNS measured runs after $WARMUP warm-up runs; each peer:"
    echo "  $PEER_RUNS after $WARMUP (warm-up lets V8 compile the hot paths)."
    echo "- Peers run on Node $NODE_VERSION with the newest releases that"
    echo "  declare support for it (pinned in bench/peers/package-lock.json):"
    echo "  the newest \`@openai/agents\` (0.15+), \`ai\` (7) and"
    echo "  \`@ai-sdk/openai\` (4) require Node >= 22."
    echo "- The OpenAI Agents peer uses \`OpenAIChatCompletionsModel\` (Chat"
    echo "  Completions, like loom), tracing disabled, \`maxTurns: 20\`; the"
    echo "  Vercel AI SDK peer uses \`streamText\` with \`openai.chat()\` and"
    echo "  \`stopWhen: stepCountIs(10)\`. Retries are off everywhere. All"
    echo "  three ask for usage in the stream (\`include_usage\`)."
    echo "- Own time includes loopback TCP and the fake's HTTP library"
    echo "  (libmicrohttpd), which the fake's busy time does not cover: it"
    echo "  is an upper bound on each implementation's own cost, with the"
    echo "  same bias for all. The CPU column is the process's CPU time"
    echo "  during the run (all threads) and excludes the fake entirely."
    if [ -n "$PEER_NOTES" ]; then
        echo "$PEER_NOTES"
    fi
    echo
    echo "## Reproduce"
    echo
    echo '```sh'
    echo "sh bench/run.sh                 # everything, writes this file"
    echo "RUNS=200 sh bench/run.sh        # quicker"
    echo "cmake --build build-bench --target loom-bench && \\"
    echo "  build-bench/loom-bench --runs 1000   # loom alone, human-readable"
    echo "sh bench/research.sh             # the research run's section alone"
    echo '```'
} >"$RESULTS"
RESULTS="$RESULTS" LOOM_BENCH_BUILD="$BUILD" sh "$ROOT/bench/research.sh"
say "done: $RESULTS"

#!/bin/sh
# Measures a whole research run (`loom-bench research`: 8 cycles x 5
# researchers x 3 search rounds against the zero-delay fake, see
# bench/README.md "A research run") and writes its section of
# bench/RESULTS.md: loom's own CPU time per run and its peak memory.
# bench/run.sh calls it after writing RESULTS.md; by itself it replaces
# the section in the RESULTS.md that is there (or appends it before
# "## Notes").
#
#   sh bench/research.sh
#
# Environment: RES_RUNS (timed runs, default 20), RES_MEM_RUNS (heap-counted
# runs, default 5), LOOM_BENCH_BUILD (build directory, default
# build-bench), RESULTS (default bench/RESULTS.md).
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${LOOM_BENCH_BUILD:-$ROOT/build-bench}
OUT=$ROOT/bench/out
RESULTS=${RESULTS:-$ROOT/bench/RESULTS.md}
RES_RUNS=${RES_RUNS:-20}
RES_MEM_RUNS=${RES_MEM_RUNS:-5}
FAKE=$BUILD/loom-fake-upstream

say() { echo "bench: $*" >&2; }

mkdir -p "$OUT"
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_C_FLAGS=-g -DLOOM_TESTS=OFF >"$OUT/res-build.log" 2>&1 ||
        { cat "$OUT/res-build.log" >&2; exit 1; }
fi
cmake --build "$BUILD" --target loom-bench loom-bench-mem loom-fake-upstream \
    -j2 >>"$OUT/res-build.log" 2>&1 || { cat "$OUT/res-build.log" >&2; exit 1; }

say "research: $RES_RUNS runs after 2 warm-up"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
"$BUILD/loom-bench" research --fake "$FAKE" --runs "$RES_RUNS" --warmup 2 \
    >"$OUT/res.txt"
cat "$OUT/res.txt" >&2
"$BUILD/loom-bench" research --fake "$FAKE" --runs "$RES_RUNS" --warmup 2 \
    --json >"$OUT/res.json"
say "research: heap, $RES_MEM_RUNS runs"
"$BUILD/loom-bench-mem" research --fake "$FAKE" --memory \
    --runs "$RES_MEM_RUNS" --warmup 1 --json >"$OUT/res-mem.json"
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

jsum() { # $1 file, $2 key, $3 sub-key: the number there
    sed -n "s/.*\"$2\":{[^}]*\"$3\":\([0-9.e+-]*\).*/\1/p" "$1"
}
jnum() { # $1 file, $2 key: the number there
    sed -n "s/.*\"$2\":\([0-9.e+-]*\).*/\1/p" "$1"
}
ms() { awk -v v="$1" 'BEGIN { printf "%.1f", v / 1000 }'; }
CPU_P50=$(ms "$(jsum "$OUT/res.json" cpu_us_per_run p50)")
CPU_MEAN=$(ms "$(jsum "$OUT/res.json" cpu_us_per_run mean)")
CPU_MAX=$(ms "$(jsum "$OUT/res.json" cpu_us_per_run max)")
PER_CALL=$(awk -v v="$(jnum "$OUT/res.json" cpu_us_per_model_call)" \
    'BEGIN { printf "%.0f", v }')
WALL_P50=$(ms "$(jsum "$OUT/res.json" wall_us_per_run p50)")
BUSY_P50=$(ms "$(jsum "$OUT/res.json" fake_busy_us_per_run p50)")
RSS0=$(jnum "$OUT/res.json" maxrss_kib_before)
RSS1=$(jnum "$OUT/res.json" maxrss_kib)
HEAP_P50=$(awk -v v="$(jsum "$OUT/res-mem.json" heap_peak_bytes_per_run p50)" \
    'BEGIN { printf "%.0f", v / 1024 }')
HEAP_MAX=$(awk -v v="$(jsum "$OUT/res-mem.json" heap_peak_bytes_per_run max)" \
    'BEGIN { printf "%.0f", v / 1024 }')
LEFT=$(jnum "$OUT/res-mem.json" heap_left_bytes)
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "?")

{
    echo "## A research run: 8 cycles x 5 researchers x 3 rounds"
    echo
    echo "\`loom-bench research\` (README.md, \"A research run\"), written by"
    echo "\`sh bench/research.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'), commit"
    echo "$COMMIT, load average $LOAD_BEFORE before, $LOAD_AFTER after. One"
    echo "research turn of a session (YAML config, no store) against the"
    echo "zero-delay fake in another process: the plan, 8 supervisor cycles"
    echo "each sending 5 researchers out in parallel, each researcher 3 rounds"
    echo "of \`web_search\` (the fake answering as SearXNG) and its report,"
    echo "then the final report (the cycle limit): 170 model calls and 120"
    echo "searches per run, every run checked (8 cycles, 40 researchers, none"
    echo "failed, the scripted report, every request seen by the fake)."
    echo
    echo "| | |"
    echo "|---|---|"
    echo "| **loom's CPU time per run** (user + system, all threads;" \
        "$RES_RUNS runs) | **p50 $CPU_P50 ms**, mean $CPU_MEAN ms, max" \
        "$CPU_MAX ms |"
    echo "| the same per model call (mean) | $PER_CALL µs |"
    echo "| **peak heap of a run** (above what was live before it;" \
        "$RES_MEM_RUNS runs) | **p50 $HEAP_P50 KiB**, max $HEAP_MAX KiB |"
    echo "| heap left after the runs | $LEFT bytes |"
    echo "| peak RSS of the process | $RSS1 KiB ($RSS0 KiB before the first" \
        "run) |"
    echo "| wall time per run, p50 | $WALL_P50 ms (the fake busy $BUSY_P50" \
        "ms of it) |"
    echo
    echo "CPU: getrusage(RUSAGE_SELF) of the benchmark process around each"
    echo "run; the fake is another process, so none of its time is in it."
    echo "Peak heap: the \`loom-bench-mem\` build counting every heap block"
    echo "(all threads, loom, libcurl and jansson alike), the high-water mark"
    echo "reset to what is live before each run; the heap left is what was"
    echo "live after the runs minus before them. Peak RSS: the process's"
    echo "high-water mark before the first run (warm-up included) and after"
    echo "the last; what the runs add to it includes what a process loads"
    echo "once, at first use (the tokenizer's vocabulary among it), and"
    echo "thread stacks, so the peak heap is the figure for a run's own"
    echo "memory. The machine is shared (see the load average): CPU figures"
    echo "are noisy. No peer is measured in this section."
    echo
} >"$OUT/res-section.md"

# The section replaces an older one, else goes before "## Notes" (or at
# the end).
if [ -f "$RESULTS" ]; then
    awk -v sec="$OUT/res-section.md" '
        function put() { while ((getline l < sec) > 0) print l; done = 1 }
        /^## A research run/ { skip = 1; if (!done) put(); next }
        /^## / && skip { skip = 0 }
        /^## Notes/ && !done { put() }
        !skip { print }
        END { if (!done) put() }
    ' "$RESULTS" >"$OUT/res-results.md"
    cp "$OUT/res-results.md" "$RESULTS"
else
    cp "$OUT/res-section.md" "$RESULTS"
fi
say "research: section written to $RESULTS"

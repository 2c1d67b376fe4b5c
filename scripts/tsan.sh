#!/bin/sh
# Builds loom with ThreadSanitizer (-DLOOM_TSAN=ON) in build-tsan and runs
# the tests of the parts where threads meet: the server, runs, the agent
# loop and sub-agents (ctest -R 'server|run|loop|subagent'). Not part of
# scripts/test.sh: it takes longer than the rest and is run by hand when
# threading changes. Every report TSan writes goes to the test's output
# (halt_on_error=0, so one run shows every race it meets) and makes the
# test fail (exitcode 66). The last line is ctest's summary.
#
#   sh scripts/tsan.sh                    # build and run
#   TSAN_TESTS='server_load' sh scripts/tsan.sh   # another ctest -R pattern
#   TSAN_BUILD=dir LOOM_JOBS=N            # build folder (build-tsan), jobs (2)
set -u
cd "$(dirname "$0")/.."
root=$(pwd)
dir=${TSAN_BUILD:-$root/build-tsan}
jobs=${LOOM_JOBS:-2}
tests=${TSAN_TESTS:-server|run|loop|subagent}

echo "== tsan: configure and build ($dir)"
if ! cmake -S "$root" -B "$dir" -DLOOM_WERROR=ON -DLOOM_TSAN=ON \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$dir.log" 2>&1 ||
   ! cmake --build "$dir" -j"$jobs" >>"$dir.log" 2>&1; then
    tail -n 50 "$dir.log"
    echo "== tsan: BUILD FAILED (log: $dir.log)"
    exit 1
fi
echo "== tsan: ctest -R '$tests'"
# second_deadlock_stack: both stacks of a lock-order inversion;
# history_size=4: older accesses stay known in long tests; tsan.supp: what
# TSan cannot see in uninstrumented libraries (jansson's reference counts).
TSAN_OPTIONS="halt_on_error=0 exitcode=66 second_deadlock_stack=1 history_size=4 suppressions=$root/scripts/tsan.supp ${TSAN_OPTIONS:-}"
export TSAN_OPTIONS
cd "$dir" && ctest -j"$jobs" --output-on-failure --timeout 900 -R "$tests"

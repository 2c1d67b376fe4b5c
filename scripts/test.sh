#!/bin/sh
# Builds loom and runs every test, twice: a normal build with -Werror, then
# the same suite under AddressSanitizer + UndefinedBehaviorSanitizer (leak
# checking on). Installs what it needs first (scripts/deps.sh). Lint
# (scripts/lint.sh) runs first and counts as one test. The release pass's
# unit and integration tests also run once more with the monotonic clock
# of a machine booted a minute ago (run_fresh_boot).
# The last line is "N passed, N failed" over all of them.
# LOOM_TEST_QUICK=1 skips the sanitizer pass (for a fast local loop).
set -u
cd "$(dirname "$0")/.."
root=$(pwd)
jobs=${LOOM_JOBS:-2}

sh scripts/deps.sh || { echo "deps failed"; echo "0 passed, 1 failed"; exit 1; }
# The tokenizer's vocabularies (docs/tokenizer.md): the tests need them.
sh scripts/vocab.sh || { echo "vocab failed"; echo "0 passed, 1 failed"; exit 1; }

passed=0
failed=0
status=0

echo "== lint"
if sh scripts/lint.sh; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    status=1
fi

# count_ctest RC LOG: prints ctest's log and adds its counts to the totals.
# Returns 1 (after counting one failure) when the log has no summary.
count_ctest() {
    rc=$1
    cat "$2"
    line=$(grep -E "tests passed, [0-9]+ tests? failed out of" "$2" | tail -n 1)
    total=$(echo "$line" | sed -E 's/.*out of ([0-9]+).*/\1/')
    nfail=$(echo "$line" | sed -E 's/.*tests passed, ([0-9]+) tests? failed.*/\1/')
    if [ -z "$line" ]; then
        failed=$((failed + 1))
        status=1
        return 1
    fi
    passed=$((passed + total - nfail))
    failed=$((failed + nfail))
    [ "$rc" -ne 0 ] && status=1
    return 0
}

# run_fresh_boot BUILD_DIR: the unit and integration tests once more (not
# cli_*, not e2e) in a time namespace whose monotonic clock reads about
# 60 s, as on a machine booted a minute ago: no test may assume uptime.
# Needs util-linux unshare and root; otherwise says it skipped.
run_fresh_boot() {
    dir=$1
    offset=$((60 - $(cut -d. -f1 /proc/uptime)))
    echo "== release, monotonic clock at 60 s (fresh boot): test"
    if ! why=$(unshare --time --monotonic="$offset" true 2>&1); then
        echo "== release, fresh boot: SKIPPED (unshare --time not permitted" \
             "here: ${why:-no reason given}; needs root and Linux >= 5.6)"
        return
    fi
    (cd "$dir" && unshare --time --monotonic="$offset" \
        ctest --output-on-failure -j"$jobs" --timeout 300 -E '^cli_') \
        >"$dir.ctest-boot.log" 2>&1
    count_ctest $? "$dir.ctest-boot.log"
}

# run_pass NAME BUILD_DIR CMAKE_ARGS...
run_pass() {
    name=$1 dir=$2
    shift 2
    echo "== $name: configure and build ($dir)"
    if ! cmake -S "$root" -B "$dir" -DLOOM_WERROR=ON "$@" >"$dir.log" 2>&1 ||
       ! cmake --build "$dir" -j"$jobs" >>"$dir.log" 2>&1; then
        cat "$dir.log"
        echo "== $name: BUILD FAILED"
        failed=$((failed + 1))
        status=1
        return
    fi
    echo "== $name: test"
    (cd "$dir" && ctest --output-on-failure -j"$jobs" --timeout 300) \
        >"$dir.ctest.log" 2>&1
    count_ctest $? "$dir.ctest.log" || return
    [ "$name" = release ] && run_fresh_boot "$dir"

    echo "== $name: end-to-end (node, official openai SDK)"
    sh "$root/scripts/e2e.sh" "$dir" >"$dir.e2e.log" 2>&1
    rc=$?
    cat "$dir.e2e.log"
    line=$(grep -E "^e2e: [0-9]+ passed, [0-9]+ failed" "$dir.e2e.log" | tail -n 1)
    if [ -z "$line" ]; then
        failed=$((failed + 1))
        status=1
        return
    fi
    passed=$((passed + $(echo "$line" | sed -E 's/^e2e: ([0-9]+) passed.*/\1/')))
    failed=$((failed + $(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')))
    [ "$rc" -ne 0 ] && status=1
}

run_pass "release" "$root/build-test" -DCMAKE_BUILD_TYPE=RelWithDebInfo
if [ "${LOOM_TEST_QUICK:-0}" != 1 ]; then
    export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    run_pass "asan+ubsan" "$root/build-asan" -DCMAKE_BUILD_TYPE=Debug \
        -DLOOM_ASAN=ON
fi
[ "$failed" -gt 0 ] && status=1
echo "$passed passed, $failed failed"
exit $status

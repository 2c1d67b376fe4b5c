#!/bin/sh
# Runs the end-to-end tests (tests/e2e/, docs/e2e.md): the official openai
# npm package against `loom serve` and the fake upstream of one build, and
# `loom tokens` against js-tiktoken on a generated 10 MB corpus; and the
# browser tests of the web UI (tests/browser/, docs/ui.md): Debian's
# Chromium driven by playwright-core, screenshots into BUILD_DIR/ui-screenshots.
#
#   sh scripts/e2e.sh [BUILD_DIR]      (default: build)
#
# BUILD_DIR must hold `loom` and `loom-fake-upstream`. Installs the pinned
# npm packages with `npm ci` when tests/e2e/node_modules (or
# tests/browser/node_modules) is missing or was installed from another
# package-lock.json. Needs node >= 20, npm and chromium.
# Each test file runs in a `node --test` of its own, one after the other,
# with two limits so that nothing can hang the suite: node's
# --test-timeout (which node 20 applies to each test and to the file as a
# whole; it ends the file's process, cancelling what was left) and, in
# case the runner itself is stuck, a wall-clock limit per file (timeout(1):
# SIGTERM, then SIGKILL 10 s later), a file stopped by it counting as one
# failed test.
# Prints the node test runner's report, then each file's summary (`# tests`,
# `# pass N`, `# fail N`, ...), and last a line "e2e: N passed, N failed"
# (cancelled tests, such as those of a suite whose setup failed, count as
# failed). Exits non-zero when anything failed.
set -u
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
build=${1:-build}
case $build in
/*) ;;
*) build="$root/$build" ;;
esac
e2e="$root/tests/e2e"
browser="$root/tests/browser"

for b in loom loom-fake-upstream; do
    if [ ! -x "$build/$b" ]; then
        echo "e2e: $build/$b not found (build it first)" >&2
        echo "e2e: 0 passed, 1 failed"
        exit 1
    fi
done
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1
then
    echo "e2e: node and npm are needed (Debian: apt-get install nodejs npm)" >&2
    echo "e2e: 0 passed, 1 failed"
    exit 1
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
    echo "e2e: node >= 20 is needed, this is $(node --version)" >&2
    echo "e2e: 0 passed, 1 failed"
    exit 1
fi

# node_modules is stale when it was installed from another lockfile: the
# lockfile's hash is kept next to it after each successful `npm ci`.
# npm_ci DIR: installs DIR's pinned packages when needed; 1 on failure.
npm_ci() {
    stamp="$1/node_modules/.loom-lock-sha256"
    want=$(sha256sum "$1/package-lock.json" | cut -d' ' -f1)
    have=$(cat "$stamp" 2>/dev/null || true)
    [ "$want" = "$have" ] && return 0
    echo "e2e: npm ci in ${1#"$root"/}"
    (cd "$1" && npm ci --no-audit --no-fund >&2) || return 1
    echo "$want" >"$stamp"
}
for dir in "$e2e" "$browser"; do
    if ! npm_ci "$dir"; then
        echo "e2e: npm ci failed" >&2
        echo "e2e: 0 passed, 1 failed"
        exit 1
    fi
done

# The slowest files (tiktoken, the browser tests) take about 20 s in CI,
# release and ASan alike, and up to two minutes on a machine shared by
# many builds; the slowest test has a limit of its own of 240 s
# (tiktoken). Ten minutes a file is far from all of these, yet ends a
# stuck file.
test_timeout_ms=600000
file_limit_s=$((test_timeout_ms / 1000 + 60))

# Spec report on stdout as the tests run; the TAP report of each file goes
# to a file of its own so its summary lines can be printed last.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom-e2e-run.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
rc=0
passed=0
failed=0
n=0
group=""
# On Ctrl-C (the tests run outside the terminal's process group) or
# SIGTERM: the running file's processes are ended too, and the counts so
# far said, the interrupted file as one failure.
interrupted() {
    if [ -n "$group" ]; then
        kill -s TERM -- "-$group" 2>/dev/null
        wait "$group"
        kill -s KILL -- "-$group" 2>/dev/null
    fi
    echo "e2e: interrupted" >&2
    echo "e2e: $passed passed, $((failed + 1)) failed"
    exit 130
}
trap interrupted INT TERM HUP
# count TAP NAME: the last "# NAME N" of a TAP report, 0 when none.
count() {
    c=$(grep -E "^# $2 [0-9]+\$" "$1" | tail -n 1 | cut -d' ' -f3)
    echo "${c:-0}"
}
for f in "$e2e"/*.test.mjs "$browser"/*.test.mjs; do
    n=$((n + 1))
    tap="$tmp/$n.tap"
    name=${f#"$root"/}
    echo "$name" >"$tmp/$n.name"
    # timeout(1) leads a process group of its own: what is left of it
    # after (a test process that ignored SIGTERM: timeout's SIGKILL only
    # reaches node's runner) is killed with it, here or on a signal.
    LOOM_BIN="$build/loom" LOOM_FAKE_BIN="$build/loom-fake-upstream" \
        LOOM_UI_SHOTS="$build/ui-screenshots" \
        timeout -k 10 "$file_limit_s" \
        node --test --test-timeout="$test_timeout_ms" \
        --test-reporter=spec --test-reporter-destination=stdout \
        --test-reporter=tap --test-reporter-destination="$tap" "$f" &
    group=$!
    wait "$group"
    frc=$?
    kill -s KILL -- "-$group" 2>/dev/null
    group=""
    if [ "$frc" -eq 124 ] || [ "$frc" -eq 137 ]; then
        echo "e2e: $name did not finish within $file_limit_s s:" \
             "stopped (counted as one failed test)" >&2
        echo "$name: stopped after $file_limit_s s" >"$tmp/$n.stuck"
        failed=$((failed + 1))
        rc=1
        continue
    fi
    fpassed=$(count "$tap" pass)
    ffailed=$(($(count "$tap" fail) + $(count "$tap" cancelled)))
    if ! grep -qE '^# pass [0-9]+$' "$tap" 2>/dev/null; then
        echo "e2e: $name: the test runner wrote no summary" >&2
        [ "$ffailed" -eq 0 ] && ffailed=1
    fi
    [ "$frc" -ne 0 ] && [ "$ffailed" -eq 0 ] && ffailed=1
    [ "$ffailed" -gt 0 ] && rc=1
    [ "$frc" -ne 0 ] && rc=1
    passed=$((passed + fpassed))
    failed=$((failed + ffailed))
done
echo "== e2e summary ($build)"
i=0
while [ "$i" -lt "$n" ]; do
    i=$((i + 1))
    echo "-- $(cat "$tmp/$i.name")"
    if [ -f "$tmp/$i.stuck" ]; then
        cat "$tmp/$i.stuck"
    else
        grep -E '^# (tests|suites|pass|fail|cancelled|skipped|todo|duration_ms) ' \
            "$tmp/$i.tap" 2>/dev/null
    fi
done
echo "e2e: $passed passed, $failed failed"
exit $rc

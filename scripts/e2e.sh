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
# Prints the node test runner's report, then its summary (`# tests`,
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

# Spec report on stdout as the tests run; the TAP report goes to a file so
# its summary lines can be printed last. The test files are named one by
# one: node 20 reads a directory argument as "every test file under it",
# newer versions read arguments as glob patterns.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom-e2e-run.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
LOOM_BIN="$build/loom" LOOM_FAKE_BIN="$build/loom-fake-upstream" \
    LOOM_UI_SHOTS="$build/ui-screenshots" \
    node --test --test-reporter=spec --test-reporter-destination=stdout \
    --test-reporter=tap --test-reporter-destination="$tmp/tap" \
    "$e2e"/*.test.mjs "$browser"/*.test.mjs
rc=$?
echo "== e2e summary ($build)"
if ! grep -E '^# (tests|suites|pass|fail|cancelled|skipped|todo|duration_ms) ' \
        "$tmp/tap"; then
    echo "e2e: the test runner wrote no summary" >&2
    [ "$rc" -eq 0 ] && rc=1
fi
count() {
    n=$(grep -E "^# $1 [0-9]+\$" "$tmp/tap" | tail -n 1 | cut -d' ' -f3)
    echo "${n:-0}"
}
passed=$(count pass)
failed=$(($(count fail) + $(count cancelled)))
[ "$rc" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1
[ "$failed" -gt 0 ] && [ "$rc" -eq 0 ] && rc=1
echo "e2e: $passed passed, $failed failed"
exit $rc

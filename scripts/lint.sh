#!/bin/sh
# Checks the rules a compiler does not: run by scripts/test.sh (first, as
# one test), or alone:
#
#   sh scripts/lint.sh
#
# 1. clang-format (the repository's .clang-format) on the lines changed:
#    since $LINT_BASE when set, else since `git merge-base HEAD main` on a
#    branch, else in the last commit (a fresh clone of main), plus what is
#    not committed and new files. Only changed lines: most files predate
#    the .clang-format, and a reformatting commit of its own is for later.
# 2. cppcheck on src/: errors, warnings and portability, no style.
# 3. clang-tidy on src/ with .clang-tidy's checks (bugs, CERT string and
#    conversion rules), from the compile_commands.json of a
#    configured build folder ($LINT_BUILD, default build-lint; configured
#    here when missing), two files at a time.
# 4. No sprintf, vsprintf, strcpy, strcat, gets, mktemp, vfork or getpw in
#    src/ (snprintf and a loom_buf do the job with a bound; mkstemp,
#    posix_spawn).
# 5. Every buffer filled from outside has a limit (curl's dynbuf rule):
#    LOOM_BUF_UNLIMITED only where the allow-list below says why.
# 6. Layers: no file includes a header of a higher layer (see LAYERS).
#
# Prints what it finds and ends with "lint: clean" (exit 0) or "lint: N
# problem(s)" (exit 1). LINT_SKIP="tidy cppcheck" skips those parts (for
# a quick local loop; scripts/test.sh never sets it).
set -u
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
jobs=${LOOM_JOBS:-2}
problems=0
skip=" ${LINT_SKIP:-} "
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() {
    echo "lint: $*"
    problems=$((problems + 1))
}

need() {
    command -v "$1" >/dev/null 2>&1 ||
        { fail "$1 is not installed (sh scripts/deps.sh)"; return 1; }
}

# ---- 1. clang-format on changed lines ------------------------------------

format_check() {
    need clang-format || return
    if [ -n "${LINT_BASE:-}" ]; then
        base=$LINT_BASE
    elif git rev-parse -q --verify main >/dev/null &&
         [ "$(git rev-parse HEAD)" != "$(git rev-parse main)" ]; then
        base=$(git merge-base HEAD main)
    elif git rev-parse -q --verify HEAD~ >/dev/null; then
        base=HEAD~
    else
        base=HEAD
    fi
    {
        git diff --name-only --diff-filter=AMR "$base" -- \
            '*.c' '*.h' 2>/dev/null
        git ls-files --others --exclude-standard -- '*.c' '*.h'
    } | sort -u >"$tmp/changed"
    while read -r f; do
        [ -f "$f" ] || continue
        if git ls-files --error-unmatch "$f" >/dev/null 2>&1; then
            # The new side of each hunk: "@@ -a,b +start,count @@".
            lines=$(git diff -U0 "$base" -- "$f" | awk '/^@@/ {
                n = split($3, a, ","); s = substr(a[1], 2)
                c = (n > 1) ? a[2] : 1
                if (c > 0) printf "--lines=%d:%d ", s, s + c - 1 }')
            [ -n "$lines" ] || continue
        else
            lines=""
        fi
        # shellcheck disable=SC2086
        if ! clang-format --dry-run --Werror $lines "$f" \
            >"$tmp/fmt" 2>&1; then
            cat "$tmp/fmt"
            fail "$f: changed lines are not clang-formatted" \
                 "(clang-format -i $lines $f)"
        fi
    done <"$tmp/changed"
}

# ---- 2. cppcheck -------------------------------------------------------

cppcheck_check() {
    need cppcheck || return
    # jansson.h is read for its iteration macros (json_array_foreach...),
    # which cppcheck cannot guess; other system headers are not needed.
    if ! cppcheck --quiet --error-exitcode=1 --std=c11 --inline-suppr \
        --enable=warning,portability -j"$jobs" \
        -D_GNU_SOURCE -DLOOM_VERSION='"lint"' -Iinclude -Isrc \
        --include=/usr/include/jansson.h \
        --suppress=missingIncludeSystem src >"$tmp/cppcheck" 2>&1; then
        cat "$tmp/cppcheck"
        fail "cppcheck found problems in src/"
    fi
}

# ---- 3. clang-tidy -----------------------------------------------------

tidy_check() {
    need clang-tidy || return
    build=${LINT_BUILD:-$root/build-lint}
    if [ ! -f "$build/compile_commands.json" ]; then
        cmake -S "$root" -B "$build" -DLOOM_TESTS=OFF \
            >"$tmp/cmake" 2>&1 ||
            { cat "$tmp/cmake"; fail "cannot configure $build"; return; }
    fi
    # Two files per process and $jobs processes: over all of src/ this
    # takes about 10 s on two cores.
    find src -name '*.c' | sort |
        xargs -P"$jobs" -n2 clang-tidy -p "$build" --quiet \
            >"$tmp/tidy" 2>"$tmp/tidy.err"
    if grep -qE '(warning|error):' "$tmp/tidy"; then
        cat "$tmp/tidy"
        fail "clang-tidy found problems in src/"
    fi
}

# ---- 4. unbounded string functions ------------------------------------

string_check() {
    if grep -nE '\b(v?sprintf|strcpy|strcat|gets|mktemp|vfork|getpw)[[:space:]]*\(' \
        -r src --include='*.c' --include='*.h' >"$tmp/str"; then
        cat "$tmp/str"
        fail "unsafe functions in src/ (snprintf, a loom_buf, mkstemp," \
             "posix_spawn do the job)"
    fi
}

# ---- 5. buffers without a limit ----------------------------------------

# file:count:reason. Each buffer here is filled only from what loom
# itself holds, already bounded where it came in (config, a request body
# under max_body_bytes, a decoded answer under its text limits, a
# response under its size cap). A new LOOM_BUF_UNLIMITED fails until it
# gets a limit or a line here; a line that is no longer needed fails too.
UNLIMITED_ALLOWED='
src/core/sse.c:4:clamps the limits it is given to what loom_buf can hold
src/core/http.c:1:keep_setup records our own request (URL, method, headers)
src/core/tokenizer_load.c:3:vocabulary folder names from the environment and the executable path
src/llm/adapter.c:1:the request body, built from the request loom holds
src/llm/attempt.c:1:jansson-escaped copy of a string loom holds
src/llm/gemini.c:1:the request URL, built from config and the model name
src/llm/gemini_stream.c:1:provider_state, built from the decoded parts (under the answer limits)
src/llm/openai.c:3:the request body cache, built from the request loom holds
src/llm/responses.c:1:instructions joined from the request messages loom holds
src/store/sqlite_memory.c:1:a MATCH expression from at most the capped search terms
src/tools/netfetch.c:1:the CURLOPT_RESOLVE entry of one checked host and its addresses
src/tools/web_fetch.c:1:the frame head: two URLs of at most 8 KiB, escaped
src/tools/web_search.c:3:URL from settings; highlights and results from a capped response
src/agent/citations.c:1:annotations of documents already cut to their limits
src/agent/context.c:1:the summary request, from messages the run holds
src/agent/review.c:3:transcript and notes from the run messages, cut to max after
src/agent/run.c:2:tool names from the registry; the answer text under the decoder limits
src/agent/session.c:1:an event text, from data the run holds (the log bounds what it keeps)
src/server/chat.c:2:model names from the config; the completion, from an answer under the decoder limits
src/server/chat_format.c:2:text and reasoning of an answer under the decoder limits
src/server/api_runs.c:1:the answer of a blocking run, from its event log under max_run_events_bytes
src/server/metrics.c:1:the metrics page, from counters loom holds
'

unlimited_check() {
    grep -rc 'LOOM_BUF_UNLIMITED' src --include='*.c' --include='*.h' |
        grep -v ':0$' | sort >"$tmp/found"
    echo "$UNLIMITED_ALLOWED" | awk -F: 'NF >= 3 { print $1 ":" $2 }' |
        sort >"$tmp/allowed"
    while IFS=: read -r f n; do
        a=$(awk -F: -v f="$f" '$1 == f { print $2 }' "$tmp/allowed")
        if [ -z "$a" ]; then
            grep -n 'LOOM_BUF_UNLIMITED' "$f"
            fail "$f: a buffer without a limit (give it one, or say why" \
                 "in scripts/lint.sh)"
        elif [ "$n" -gt "$a" ]; then
            grep -n 'LOOM_BUF_UNLIMITED' "$f"
            fail "$f: $n buffers without a limit, $a allowed"
        elif [ "$n" -lt "$a" ]; then
            fail "$f: the allow-list says $a unlimited buffers, there are" \
                 "$n: lower it in scripts/lint.sh"
        fi
    done <"$tmp/found"
    while IFS=: read -r f a; do
        grep -q "^$f:" "$tmp/found" ||
            fail "$f: no longer uses LOOM_BUF_UNLIMITED: drop its line" \
                 "from scripts/lint.sh"
    done <"$tmp/allowed"
}

# ---- 6. layers -----------------------------------------------------------

# core < llm, tools, store < agent < server < cli. A file may include the
# headers of its own layer and of lower ones, never of a sibling (llm,
# tools and store do not know each other). The CLI sits above the server
# because `loom serve` starts it (through loom/server.h). The front ends
# (server, cli) include only public headers (loom/*.h), their own, and
# core's small private helpers (FRONT_CORE): if one needs more, the
# library is missing a function.
#
# Public headers belong to the layer that implements them.
public_layer() {
    case $1 in
    buf | cancel | common | config | log | message | pool | sse | tokenizer) echo core ;;
    llm | router) echo llm ;;
    tools | mcp) echo tools ;;
    store | accounts | limits | jwt) echo store ;;
    agent | context | memory | recorder | run | session) echo agent ;;
    server) echo server ;;
    *) echo unknown ;;
    esac
}

rank() {
    case $1 in
    core) echo 0 ;;
    llm | tools | store) echo 1 ;;
    agent) echo 2 ;;
    server) echo 3 ;;
    cli) echo 4 ;;
    *) echo 9 ;;
    esac
}

FRONT_CORE="core/clock.h core/error.h core/text.h core/utf8.h"

# "file header" pairs that break the rule today, each to be removed by
# the change that fixes it (a line no longer needed fails the check, so
# the list only shrinks).
LAYER_ALLOWED='
'

layer_check() {
    : >"$tmp/layer"
    for f in $(find src include/loom -name '*.[ch]' | sort); do
        case $f in
        include/loom/*)
            b=$(basename "$f" .h)
            own=$(public_layer "$b")
            [ "$own" = unknown ] &&
                fail "$f: add it to public_layer() in scripts/lint.sh"
            ;;
        *) own=$(echo "$f" | cut -d/ -f2) ;;
        esac
        sed -n 's/^#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f" |
            while read -r h; do
                case $f:$h in
                include/loom/*:*/*) ;;
                include/loom/*) h=loom/$h ;;
                esac
                case $h in
                loom/*.h)
                    hl=$(public_layer "$(basename "$h" .h)")
                    private=0
                    ;;
                */*) hl=${h%%/*} private=1 ;;
                *) continue ;; # a header beside the file
                esac
                bad=""
                if [ "$hl" != "$own" ]; then
                    if [ "$(rank "$hl")" -ge "$(rank "$own")" ]; then
                        bad="a header of layer $hl"
                    elif [ $private = 1 ] &&
                         { [ "$own" = server ] || [ "$own" = cli ]; }; then
                        case " $FRONT_CORE " in
                        *" $h "*) ;;
                        *) bad="a private header of $hl in a front end" ;;
                        esac
                    fi
                fi
                [ -n "$bad" ] && echo "$f $h $own $bad"
            done >>"$tmp/layer"
    done
    echo "$LAYER_ALLOWED" | awk 'NF == 2' | sort >"$tmp/layer_allowed"
    while read -r f h own why; do
        grep -qx "$f $h" "$tmp/layer_allowed" ||
            fail "$f (layer $own) includes $h: $why"
    done <"$tmp/layer"
    while read -r f h; do
        grep -q "^$f $h " "$tmp/layer" ||
            fail "$f no longer includes $h: drop the line from" \
                 "LAYER_ALLOWED in scripts/lint.sh"
    done <"$tmp/layer_allowed"
}

format_check
case $skip in *" cppcheck "*) ;; *) cppcheck_check ;; esac
case $skip in *" tidy "*) ;; *) tidy_check ;; esac
string_check
unlimited_check
layer_check

if [ "$problems" -gt 0 ]; then
    echo "lint: $problems problem(s)"
    exit 1
fi
echo "lint: clean"

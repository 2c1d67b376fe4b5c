#!/bin/sh
# Installs every Debian package loom's build, tests and benchmarks need.
# Idempotent: installs nothing when all are present; runs apt-get update
# only when something is missing. Needs root (or sudo) on Debian 12. Then
# fetches the tokenizer's vocabularies (scripts/vocab.sh, npm registry).
set -eu
PKGS="build-essential cmake pkg-config git ca-certificates tzdata
libcurl4-openssl-dev libjansson-dev libyaml-dev libmicrohttpd-dev
libcmocka-dev libsqlite3-dev libpcre2-dev libssl-dev valgrind libjsmn-dev
libxml2-dev libedit-dev libjwt-dev libmimalloc-dev clang-format clang-tidy cppcheck tmux chromium
sqlite3 jq curl"
missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
        missing="$missing $p"
    fi
done
# Node.js and npm build the web UI and run the end-to-end tests (the
# official openai SDK); chromium (above) runs the web UI's browser tests.
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 ||
    missing="$missing nodejs npm"
if [ -n "$missing" ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "deps: installing:$missing" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
        --no-install-recommends $missing >&2
fi
# The tokenizer's vocabularies (npm `tiktoken`, docs/tokenizer.md). loom
# runs without them (it estimates token counts and says so), so a failure
# here is a warning; scripts/test.sh requires them.
sh "$(dirname "$0")/vocab.sh" ||
    echo "deps: warning: tokenizer vocabularies not installed (run sh scripts/vocab.sh)" >&2
exit 0

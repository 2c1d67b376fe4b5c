#!/bin/sh
# Installs every Debian package loom's build, tests and benchmarks need.
# Idempotent: does nothing when all are present; runs apt-get update only
# when something is missing. Needs root (or sudo) on Debian 12.
set -eu
PKGS="build-essential cmake pkg-config git ca-certificates tzdata
libcurl4-openssl-dev libjansson-dev libyaml-dev libmicrohttpd-dev
libcmocka-dev libsqlite3-dev libpcre2-dev libssl-dev valgrind libjsmn-dev
libxml2-dev libjansson-doc"
missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
        missing="$missing $p"
    fi
done
# Node.js and npm run the end-to-end tests (the official openai SDK).
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 ||
    missing="$missing nodejs npm"
[ -z "$missing" ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "deps: installing:$missing" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >&2

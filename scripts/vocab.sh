#!/bin/sh
# Fetches and converts the tokenizer vocabularies (docs/tokenizer.md).
#
#   sh scripts/vocab.sh
#
# Installs the pinned npm package `tiktoken` into vocab/node_modules with
# `npm ci` (vocab/package.json, vocab/package-lock.json), then converts its
# encoders/{o200k_base,cl100k_base}.json with node (vocab/convert.mjs) into
# vocab/data/ENCODING.tiktoken (the standard rank file) and
# vocab/data/ENCODING.meta.json (pattern, special tokens, Unicode classes).
# loom finds vocab/data relative to its executable (or $LOOM_VOCAB_DIR).
#
# Idempotent: does nothing when vocab/data is newer than the lockfile and
# the converter, and node_modules was installed from this lockfile. Needs
# node >= 20 and npm (scripts/deps.sh installs them). Exits non-zero, with
# the reason on stderr, when anything failed.
set -u
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
dir="$root/vocab"
out="$dir/data"
encodings="o200k_base cl100k_base"

die() {
    echo "vocab: $*" >&2
    exit 1
}

command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 ||
    die "node and npm are needed (Debian: apt-get install nodejs npm)"

# node_modules is stale when it was installed from another lockfile.
stamp="$dir/node_modules/.loom-lock-sha256"
want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
if [ "$want" != "$have" ]; then
    echo "vocab: npm ci" >&2
    (cd "$dir" && npm ci --no-audit --no-fund >&2) || die "npm ci failed"
    echo "$want" >"$stamp" || die "cannot write $stamp"
fi

# Up to date when every output is newer than its inputs.
fresh=1
for e in $encodings; do
    for f in "$out/$e.tiktoken" "$out/$e.meta.json"; do
        if [ ! -s "$f" ] || [ "$f" -ot "$stamp" ] ||
           [ "$f" -ot "$dir/convert.mjs" ]; then
            fresh=0
        fi
    done
done
[ "$fresh" -eq 1 ] && exit 0

# shellcheck disable=SC2086 # the encodings are words
node "$dir/convert.mjs" "$dir/node_modules/tiktoken/encoders" "$out" \
    $encodings >&2 || die "conversion failed"

#!/bin/sh
# Tokenizer throughput: loom against the npm packages tiktoken (Rust
# compiled to WASM) and js-tiktoken (pure JavaScript), on the same corpus
# in the same run; prints a table and writes bench/RESULTS-tokenizer.md.
#
#   sh bench/tokenizer.sh
#
# Steps: the vocabularies (scripts/vocab.sh); `npm ci` in tests/e2e when
# its node_modules is stale (the packages are pinned there); a Release
# build of `loom` in its own build directory; the corpus of the exactness
# test (tests/e2e/corpus.mjs, 10.6 MB) written to bench/out/tokenizer/;
# then, per encoding, `loom tokens --bench N` (the fastest of N passes of
# the count-only path and of encode, after the vocabulary is loaded) and the
# best of the peers' passes (bench/tokenizer.mjs). Per kind of document
# too, loom against tiktoken. MB/s is input bytes (10^6) per second on
# one thread.
#
# Environment: LOOM_PASSES (default 5), WASM_PASSES (3), JS_PASSES (1),
# LOOM_TOKBENCH_BUILD (build directory, default build-bench-tok), RESULTS
# (default bench/RESULTS-tokenizer.md), KINDS=0 to skip the per-kind table.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${LOOM_TOKBENCH_BUILD:-$ROOT/build-bench-tok}
OUT=$ROOT/bench/out/tokenizer
RESULTS=${RESULTS:-$ROOT/bench/RESULTS-tokenizer.md}
LOOM_PASSES=${LOOM_PASSES:-5}
WASM_PASSES=${WASM_PASSES:-3}
JS_PASSES=${JS_PASSES:-1}
KINDS=${KINDS:-1}
LOOM=$BUILD/loom
E2E=$ROOT/tests/e2e

say() { echo "bench: $*" >&2; }

mkdir -p "$OUT"
sh "$ROOT/scripts/vocab.sh"
stamp="$E2E/node_modules/.loom-lock-sha256"
want=$(sha256sum "$E2E/package-lock.json" | cut -d' ' -f1)
if [ "$want" != "$(cat "$stamp" 2>/dev/null || true)" ]; then
    say "npm ci in tests/e2e"
    (cd "$E2E" && npm ci --no-audit --no-fund >&2)
    echo "$want" >"$stamp"
fi

say "building loom (Release) in $BUILD"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLOOM_TESTS=OFF \
    >"$OUT/build.log" 2>&1 || { cat "$OUT/build.log" >&2; exit 1; }
cmake --build "$BUILD" --target loom -j2 >>"$OUT/build.log" 2>&1 ||
    { cat "$OUT/build.log" >&2; exit 1; }

say "writing the corpus"
node "$ROOT/bench/tokenizer.mjs" corpus "$OUT" >"$OUT/corpus.json"
BYTES=$(wc -c <"$OUT/corpus.bin")
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# field NAME from "bench: ...; count X MB/s; encode Y MB/s" and friends
loom_field() { # line what
    case $2 in
    count) echo "$1" | sed -E 's/.*count ([0-9.]+) MB\/s.*/\1/' ;;
    encode) echo "$1" | sed -E 's/.*encode ([0-9.]+) MB\/s.*/\1/' ;;
    tokens) echo "$1" | sed -E 's/.* ([0-9]+) tokens;.*/\1/' ;;
    load) echo "$1" | sed -E 's/.*load ([0-9.]+) ms.*/\1/' ;;
    esac
}
json_field() { # json path
    node -e 'const o=JSON.parse(process.argv[1]);
             const v=process.argv[2].split(".").reduce((a,k)=>a&&a[k],o);
             console.log(typeof v==="number"&&!Number.isInteger(v)?
                         v.toFixed(2):v??"-")' "$1" "$2"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1fx", a / b }'; }

TABLE="| encoding | loom count | loom encode | tiktoken (WASM) | js-tiktoken \
| loom count / WASM | tokens: loom = js-tiktoken / WASM |
|---|---:|---:|---:|---:|---:|---|"
for enc in o200k_base cl100k_base; do
    say "$enc: loom, $LOOM_PASSES passes"
    line=$("$LOOM" tokens --encoding "$enc" --bench "$LOOM_PASSES" \
        "$OUT/corpus.bin")
    echo "$line" >"$OUT/loom-$enc.txt"
    say "$enc: tiktoken x$WASM_PASSES, js-tiktoken x$JS_PASSES"
    peers=$(node "$ROOT/bench/tokenizer.mjs" peers "$OUT/corpus.bin" "$enc" \
        "$WASM_PASSES" "$JS_PASSES")
    echo "$peers" >"$OUT/peers-$enc.json"
    c=$(loom_field "$line" count)
    e=$(loom_field "$line" encode)
    n=$(loom_field "$line" tokens)
    w=$(json_field "$peers" wasm.mbps)
    j=$(json_field "$peers" js.mbps)
    nw=$(json_field "$peers" wasm.tokens)
    nj=$(json_field "$peers" js.tokens)
    same="different"
    [ "$n" = "$nj" ] && same="same"
    TABLE="$TABLE
| $enc | $c MB/s | $e MB/s | $w MB/s | $j MB/s | $(ratio "$c" "$w") \
| $n ($same as js-tiktoken's $nj) / $nw |"
    LOAD_MS="${LOAD_MS:+$LOAD_MS, }$enc $(loom_field "$line" load) ms"
done

KTABLE=""
if [ "$KINDS" != 0 ]; then
    KTABLE="| kind | bytes | loom count (o200k_base) | tiktoken (WASM) \
| loom / WASM |
|---|---:|---:|---:|---:|"
    for f in "$OUT"/kind-*.bin; do
        k=$(basename "$f" .bin | sed 's/^kind-//')
        say "kind $k"
        line=$("$LOOM" tokens --bench "$LOOM_PASSES" "$f")
        peers=$(node "$ROOT/bench/tokenizer.mjs" peers "$f" o200k_base \
            "$WASM_PASSES" 0)
        c=$(loom_field "$line" count)
        w=$(json_field "$peers" wasm.mbps)
        KTABLE="$KTABLE
| $k | $(wc -c <"$f") | $c MB/s | $w MB/s | $(ratio "$c" "$w") |"
    done
fi
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

CPU=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n 1)
NCPU=$(nproc)
KERNEL=$(uname -sr)
CC=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
CC_VERSION=$("$CC" --version | head -n 1)
PCRE2=$(pcre2-config --version 2>/dev/null || echo "?")
NODE=$(node --version)
pkg() { node -p "require('$E2E/node_modules/$1/package.json').version"; }

echo "$TABLE"
[ -n "$KTABLE" ] && echo && echo "$KTABLE"

cat >"$RESULTS" <<EOF
# Tokenizer throughput: results

Written by \`sh bench/tokenizer.sh\` on $(date -u +%Y-%m-%d). What is
measured: input bytes (10^6) per second, on one thread, tokenizing the
corpus of the exactness test (tests/e2e/corpus.mjs: $BYTES bytes of
prose in several scripts, code, JSON, emoji, digit and whitespace runs,
special-token text, random code points, some invalid UTF-8), best of
$LOOM_PASSES passes for loom, $WASM_PASSES for tiktoken, $JS_PASSES for
js-tiktoken, all in the same run.

- **loom count**: \`loom_tokenizer_count()\` (the count-only path),
  from bytes: UTF-8 check, class normalisation, PCRE2 JIT, BPE.
- **loom encode**: \`loom_tokenizer_encode()\`, ids into an array.
- **tiktoken (WASM)**: npm \`tiktoken\` $(pkg tiktoken), \`encode_ordinary\`
  on the decoded JS string (decoding not timed).
- **js-tiktoken**: npm \`js-tiktoken\` $(pkg js-tiktoken),
  \`encode(text, [], [])\` on the same string.

Vocabulary load (\`loom tokens --bench\`, parse + index + pattern JIT):
$LOAD_MS.

## Whole corpus

$TABLE

Token counts: loom's ids are js-tiktoken's exactly (the e2e test checks
every id). tiktoken (WASM, Rust \`fancy-regex\`) splits a few characters
differently from JavaScript's RegExp (U+0085 and U+FEFF as whitespace or
not, \`'ſ\` as a contraction), hence its slightly different count.

EOF
if [ -n "$KTABLE" ]; then
    cat >>"$RESULTS" <<EOF
## Per kind of document (o200k_base)

$KTABLE

EOF
fi
cat >>"$RESULTS" <<EOF
## Machine

- CPU: $CPU, $NCPU cores (loom and the peers use one)
- Kernel: $KERNEL
- Compiler: $CC_VERSION, CMake Release (-O3)
- PCRE2: $PCRE2 (JIT); node: $NODE
- Load average before / after: $LOAD_BEFORE / $LOAD_AFTER (a shared
  machine: other work may have run beside the benchmark)

loom's rank lookups are bound by memory latency, so on a shared machine
its figures move with what else runs (by up to a half between runs
here); the peers move less. Compare the columns of one run.

Raw outputs: bench/out/tokenizer/ (ignored by git).
EOF
say "wrote $RESULTS"

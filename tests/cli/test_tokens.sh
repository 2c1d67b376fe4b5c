#!/bin/sh
# Shell tests of `loom tokens`: help, counts and ids of known texts in
# both encodings (the ids are js-tiktoken's), stdin and files, --json,
# --special, --model (exact and estimated), the --max-bytes limit (at and
# past it), usage errors (exit 2), unreadable input (exit 1), and the
# missing-vocabulary error naming scripts/vocab.sh.
# Needs LOOM_BIN and LOOM_SOURCE_DIR (set by CTest) and the vocabularies
# (scripts/vocab.sh).
set -u
: "${LOOM_BIN:?}" "${LOOM_SOURCE_DIR:?}"
LOOM_VOCAB_DIR="$LOOM_SOURCE_DIR/vocab/data"
export LOOM_VOCAB_DIR
tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom-tokens-XXXXXX")
fails=0
checks=0
trap 'rm -rf "$tmp"' EXIT

ok() { checks=$((checks + 1)); }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }
expect_rc() { # expected actual what
    if [ "$1" -eq "$2" ]; then ok; else bad "$3: exit $2, expected $1"; fi
}
expect_out() { # expected file what
    if [ "$(cat "$2")" = "$1" ]; then ok; else
        bad "$3: got '$(cat "$2")', expected '$1'"; fi
}
expect_grep() { # pattern file what
    if grep -q -- "$1" "$2"; then ok; else
        bad "$3: '$1' not in $2:"; sed 's/^/    /' "$2" | head -20; fi
}

if [ ! -s "$LOOM_VOCAB_DIR/o200k_base.tiktoken" ]; then
    echo "FAIL: no vocabulary in $LOOM_VOCAB_DIR: run scripts/vocab.sh"
    exit 1
fi

# --- help ---
"$LOOM_BIN" tokens --help > "$tmp/out" 2>&1; expect_rc 0 $? "tokens --help"
expect_grep "usage: loom tokens" "$tmp/out" "tokens --help"
"$LOOM_BIN" --help > "$tmp/out" 2>&1
expect_grep "tokens" "$tmp/out" "loom --help lists tokens"

# --- counts and ids ---
printf 'Hello world' > "$tmp/hello"
"$LOOM_BIN" tokens "$tmp/hello" > "$tmp/out" 2>&1
expect_rc 0 $? "count a file"
expect_out "2" "$tmp/out" "o200k_base count"
"$LOOM_BIN" tokens --ids "$tmp/hello" > "$tmp/out" 2>&1
expect_out "13225 2375
2" "$tmp/out" "o200k_base ids"
"$LOOM_BIN" tokens --ids -e cl100k_base - < "$tmp/hello" > "$tmp/out" 2>&1
expect_rc 0 $? "stdin"
expect_out "9906 1917
2" "$tmp/out" "cl100k_base ids from stdin"
printf '' | "$LOOM_BIN" tokens - > "$tmp/out" 2>&1
expect_out "0" "$tmp/out" "empty input"
# contractions, JavaScript whitespace (U+FEFF) and not (U+0085)
printf "it's IT'S x\302\205y\357\273\277z" > "$tmp/mixed"
"$LOOM_BIN" tokens --ids "$tmp/mixed" > "$tmp/out" 2>&1
expect_out "64190 8734 31233 1215 126 227 88 5574 89
9" "$tmp/out" "contractions and whitespace"
# a path to a rank file
"$LOOM_BIN" tokens -e "$LOOM_VOCAB_DIR/cl100k_base.tiktoken" "$tmp/hello" \
    > "$tmp/out" 2>&1
expect_out "2" "$tmp/out" "--encoding PATH"

# --- --json and --special ---
printf 'a<|endoftext|>' > "$tmp/special"
"$LOOM_BIN" tokens --json --ids --special "$tmp/special" > "$tmp/out" 2>&1
want='{"encoding":"o200k_base","model":null,"exact":true,"tokens":2,'
want="$want"'"ids":[64,199999]}'
expect_out "$want" "$tmp/out" "--json --ids --special"
"$LOOM_BIN" tokens "$tmp/special" > "$tmp/out" 2>&1
expect_out "8" "$tmp/out" "special-token text is text without --special"

# --- --model ---
"$LOOM_BIN" tokens --model openai/gpt-4o "$tmp/hello" > "$tmp/out" 2>&1
expect_out "2" "$tmp/out" "--model gpt-4o"
printf '1234567' > "$tmp/digits"
"$LOOM_BIN" tokens --model gpt-4 --json "$tmp/digits" > "$tmp/out" 2>&1
want='{"encoding":"cl100k_base","model":"gpt-4","exact":true,"tokens":3}'
expect_out "$want" "$tmp/out" "--model gpt-4"
"$LOOM_BIN" tokens --model anthropic/claude-sonnet-4-5 "$tmp/hello" \
    > "$tmp/out" 2> "$tmp/err"
expect_rc 0 $? "--model claude"
expect_grep "estimate" "$tmp/err" "claude says it estimates"
expect_grep "^[1-9][0-9]*$" "$tmp/out" "claude count"
"$LOOM_BIN" tokens --model claude-sonnet-4-5 --ids "$tmp/hello" \
    > "$tmp/out" 2>&1
expect_rc 2 $? "--ids of an estimate"

# --- the --max-bytes limit ---
"$LOOM_BIN" tokens --max-bytes 11 "$tmp/hello" > "$tmp/out" 2>&1
expect_rc 0 $? "input at --max-bytes"
"$LOOM_BIN" tokens --max-bytes 10 "$tmp/hello" > "$tmp/out" 2>&1
expect_rc 1 $? "input past --max-bytes"
expect_grep "larger than 10 bytes" "$tmp/out" "--max-bytes message"
"$LOOM_BIN" tokens --max-bytes 10 - < "$tmp/hello" > "$tmp/out" 2>&1
expect_rc 1 $? "stdin past --max-bytes"
"$LOOM_BIN" tokens --max-bytes 1073741825 "$tmp/hello" > "$tmp/out" 2>&1
expect_rc 2 $? "--max-bytes over 1 GiB"

# --- usage errors and failures ---
"$LOOM_BIN" tokens --bogus "$tmp/hello" > "$tmp/out" 2>&1
expect_rc 2 $? "unknown option"
"$LOOM_BIN" tokens --encoding > "$tmp/out" 2>&1
expect_rc 2 $? "option without value"
"$LOOM_BIN" tokens "$tmp/hello" "$tmp/hello" > "$tmp/out" 2>&1
expect_rc 2 $? "two inputs"
"$LOOM_BIN" tokens -e o200k_base -m gpt-4o "$tmp/hello" > "$tmp/out" 2>&1
expect_rc 2 $? "--encoding and --model"
"$LOOM_BIN" tokens --max-bytes zero "$tmp/hello" > "$tmp/out" 2>&1
expect_rc 2 $? "bad --max-bytes"
"$LOOM_BIN" tokens -e p50k_base "$tmp/hello" > "$tmp/out" 2>&1
expect_rc 2 $? "unknown encoding"
expect_grep "scripts/vocab.sh" "$tmp/out" "unknown encoding names the script"
"$LOOM_BIN" tokens -e foo "$tmp/hello" > "$tmp/out" 2>&1
expect_rc 2 $? "unknown encoding foo"
expect_grep "unknown encoding 'foo' (known: o200k_base, cl100k_base)" \
    "$tmp/out" "unknown encoding foo names the known ones"
if grep -q "no vocabulary" "$tmp/out"; then
    bad "unknown encoding foo says no vocabulary"; else ok; fi
"$LOOM_BIN" tokens "$tmp/missing" > "$tmp/out" 2>&1
expect_rc 1 $? "missing input file"

# --- no vocabulary ---
mkdir "$tmp/empty"
LOOM_VOCAB_DIR="$tmp/empty" "$LOOM_BIN" tokens "$tmp/hello" \
    > "$tmp/out" 2>&1
expect_rc 2 $? "missing vocabulary"
expect_grep "run scripts/vocab.sh" "$tmp/out" "missing vocabulary message"
expect_grep "$tmp/empty" "$tmp/out" "missing vocabulary names the folder"
# a model falls back to the estimator, and says so once
LOOM_VOCAB_DIR="$tmp/empty" "$LOOM_BIN" tokens --model gpt-4o "$tmp/hello" \
    > "$tmp/out" 2> "$tmp/err"
expect_rc 0 $? "estimate without vocabulary"
expect_out "3" "$tmp/out" "length estimate of 11 bytes"
if [ "$(grep -c "scripts/vocab.sh" "$tmp/err")" -eq 1 ]; then ok; else
    bad "the fallback is logged once:"; cat "$tmp/err"; fi

echo "tokens: $checks checks, $fails failed"
[ "$fails" -eq 0 ]

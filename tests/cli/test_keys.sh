#!/bin/sh
# Shell tests of `loom keys`: help and usage errors, create (the key as
# the last line, or JSON), list (never a secret) and revoke, then the
# same on the database of a running `loom serve` in auth mode keys: a
# key made while it runs works at once, a key revoked while it runs is
# refused at its next request, and neither key shows in the server's
# log. Needs LOOM_BIN (set by CTest) and curl for the server part.
set -u
: "${LOOM_BIN:?}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom-keys-XXXXXX")
fails=0
checks=0
serve_pid=""

cleanup() {
    [ -n "$serve_pid" ] && kill -9 "$serve_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

ok() { checks=$((checks + 1)); }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }
expect_rc() { # expected actual what
    if [ "$1" -eq "$2" ]; then ok; else bad "$3: exit $2, expected $1"; fi
}
expect_grep() { # pattern file what
    if grep -q -- "$1" "$2"; then ok; else
        bad "$3: '$1' not in $2:"; sed 's/^/    /' "$2" | head -20; fi
}
expect_no() { # fixed-string file what
    if grep -qF -- "$1" "$2"; then bad "$3: found in $2"; else ok; fi
}
keys() { "$LOOM_BIN" keys "$@"; }
db="$tmp/loom.db"

# --- help and usage ---
keys --help > "$tmp/out" 2>&1; expect_rc 0 $? "keys --help"
expect_grep "usage: loom keys create" "$tmp/out" "keys --help"
"$LOOM_BIN" --help > "$tmp/out" 2>&1
expect_grep "keys create" "$tmp/out" "loom --help lists keys"
keys > "$tmp/out" 2>&1; expect_rc 2 $? "no subcommand"
keys create --user a > "$tmp/out" 2>&1; expect_rc 2 $? "no --db"
expect_grep "\-\-db PATH is required" "$tmp/out" "no --db message"
keys create --db "$db" > "$tmp/out" 2>&1; expect_rc 2 $? "no --user"
keys create --db "$db" --user "a/b" > "$tmp/out" 2>&1
expect_rc 2 $? "bad user name"
keys create --db "$db" --user a --rpm lots > "$tmp/out" 2>&1
expect_rc 2 $? "bad --rpm"
keys create --db "$db" --user a --expires tomorrow > "$tmp/out" 2>&1
expect_rc 2 $? "bad --expires"
keys create --db "$db" --user a --budget-period week > "$tmp/out" 2>&1
expect_rc 2 $? "bad --budget-period"
keys revoke --db "$db" 0000000000000000 > "$tmp/out" 2>&1
expect_rc 1 $? "revoke an unknown key"

# --- create, list, revoke ---
keys create --db "$db" --user alice --workspace acme --rpm 60 \
    --budget-usd 2.5 --budget-period month --agents helper \
    --expires 2099-01-01 > "$tmp/out" 2>&1
expect_rc 0 $? "create"
k1=$(tail -n 1 "$tmp/out")
case "$k1" in lk_????????????????_*) ok ;; *) bad "last line is not a key: $k1" ;; esac
id1=$(printf '%s' "$k1" | cut -c4-19)
keys create --db "$db" --user svc --service --json > "$tmp/json" 2>&1
expect_rc 0 $? "create --json"
expect_grep '"service": true' "$tmp/json" "create --json service"
expect_grep '"key": "lk_' "$tmp/json" "create --json key"
keys list --db "$db" > "$tmp/list" 2>&1; expect_rc 0 $? "list"
expect_grep "$id1  acme/alice" "$tmp/list" "list shows the key"
keys list --db "$db" --json > "$tmp/listj" 2>&1
expect_grep '"budget_micros": 2500000' "$tmp/listj" "list --json limits"
expect_no "$(printf '%s' "$k1" | cut -c21-)" "$tmp/listj" "list holds no secret"
keys revoke --db "$db" "$id1" > "$tmp/out" 2>&1; expect_rc 0 $? "revoke"
keys list --db "$db" > "$tmp/list" 2>&1
expect_grep "$id1  acme/alice revoked" "$tmp/list" "list shows it revoked"

# --- on the database of a running server ---
if command -v curl > /dev/null; then
    # A provider the test never calls (listing models makes no call).
    printf 'providers:\n  p: {base_url: "http://127.0.0.1:9", api_key: x}\nauth:\n  mode: keys\n' \
        > "$tmp/loom.yaml"
    env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" "$LOOM_BIN" serve -c "$tmp/loom.yaml" \
        --listen 127.0.0.1:0 --db "$db" --log-level debug \
        > "$tmp/serve.out" 2> "$tmp/serve.err" &
    serve_pid=$!
    i=0
    while ! grep -q listening "$tmp/serve.out" 2>/dev/null; do
        i=$((i + 1))
        if [ $i -gt 400 ] || ! kill -0 "$serve_pid" 2>/dev/null; then
            bad "loom serve did not start"; cat "$tmp/serve.err"; break
        fi
        sleep 0.05
    done
    addr=$(sed -n 's/^listening \(127.0.0.1:[0-9]*\).*/\1/p' "$tmp/serve.out")
    keys create --db "$db" --user bob > "$tmp/out" 2>&1
    expect_rc 0 $? "create while serving"
    k2=$(tail -n 1 "$tmp/out")
    code=$(curl -s -o "$tmp/r" -w '%{http_code}' \
        -H "Authorization: Bearer $k2" "http://$addr/v1/models")
    [ "$code" = 200 ] && ok || bad "a new key works at once: $code"
    code=$(curl -s -o "$tmp/r" -w '%{http_code}' \
        -H "Authorization: Bearer $k1" "http://$addr/v1/models")
    [ "$code" = 401 ] && ok || bad "a revoked key is refused: $code"
    expect_grep invalid_api_key "$tmp/r" "revoked key error code"
    keys revoke --db "$db" "$k2" > "$tmp/out" 2>&1
    expect_rc 0 $? "revoke while serving (by the whole key)"
    code=$(curl -s -o "$tmp/r" -w '%{http_code}' \
        -H "Authorization: Bearer $k2" "http://$addr/v1/models")
    [ "$code" = 401 ] && ok || bad "revoked while serving: $code"
    kill -TERM "$serve_pid"; wait "$serve_pid" 2>/dev/null; serve_pid=""
    for k in "$k1" "$k2"; do
        expect_no "$k" "$tmp/serve.err" "no key in the server's log"
        expect_no "$(printf '%s' "$k" | cut -c21-)" "$tmp/serve.err" \
            "no secret in the server's log"
    done
    expect_grep "GET /v1/models 401" "$tmp/serve.err" "requests are logged"
fi

echo "test_keys: $checks checks, $fails failed"
[ "$fails" -eq 0 ]

#!/bin/sh
# Shell tests of per-user MCP OAuth credentials (accounts on): `loom mcp
# login --user` keeps each user's own tokens under (server, user) against
# tests/mcp/fake_oauth_mcp.mjs, whose tokens last 5 s so that every use
# refreshes them first (its refresh tokens are good once). Each user's
# calls carry that user's own token (the fake says whose client it is and
# logs each call's), a refresh of one user's never touches another's (a
# refresh token used twice would be "refresh unknown"), a user without
# credentials is told how to connect, the server's own credentials stay
# apart, and --workspace, a full user id and --db are honoured.
set -u
: "${LOOM_BIN:?}"
: "${LOOM_SOURCE_DIR:?}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom-users-XXXXXX")
fails=0
checks=0
node_pid=
cleanup() {
    [ -n "$node_pid" ] && kill "$node_pid" 2>/dev/null
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
expect_count() { # n pattern file what
    got=$(grep -c -- "$2" "$3")
    if [ "$got" -eq "$1" ]; then ok; else bad "$4: $got of '$2', expected $1"; fi
}

command -v node >/dev/null || { echo "node is needed"; exit 1; }
command -v curl >/dev/null || { echo "curl is needed"; exit 1; }
command -v sqlite3 >/dev/null || { echo "sqlite3 is needed"; exit 1; }
unset LOOM_SECRET_KEY http_proxy https_proxy HTTP_PROXY HTTPS_PROXY

mkfifo "$tmp/node.out"
FAKE_OAUTH_LOG="$tmp/oauth.log" FAKE_OAUTH_EXPIRES_IN=5 node \
    "$LOOM_SOURCE_DIR/tests/mcp/fake_oauth_mcp.mjs" >"$tmp/node.out" &
node_pid=$!
read -r _ port <"$tmp/node.out"

cat >"$tmp/loom.yaml" <<YAML
server: {db: $tmp/data/loom.db}
mcp_servers:
  web: {url: "http://127.0.0.1:$port/mcp"}
YAML
cfg="--config $tmp/loom.yaml"

# `loom mcp login web --user $1`, curl playing the browser; its output
# in $tmp/login.txt. Returns login's exit code.
login_as() {
    rm -f "$tmp/login.out" "$tmp/waiting" "$tmp/login.txt"
    mkfifo "$tmp/login.out" "$tmp/waiting"
    "$LOOM_BIN" mcp login $cfg --timeout 60 --user "$1" web \
        >"$tmp/login.out" 2>"$tmp/login.err" &
    lp=$!
    (
        signalled=
        while IFS= read -r line; do
            printf '%s\n' "$line" >>"$tmp/login.txt"
            case $line in
            Waiting*) [ -z "$signalled" ] && { echo go >"$tmp/waiting"; signalled=1; } ;;
            esac
        done <"$tmp/login.out"
        [ -z "$signalled" ] && echo none >"$tmp/waiting"
    ) &
    rp=$!
    read -r what <"$tmp/waiting"
    if [ "$what" = go ]; then
        url=$(sed -n 's/^  \(http:.*\)$/\1/p' "$tmp/login.txt")
        curl -s -L --max-time 30 "$url" >"$tmp/browser"
    fi
    wait "$lp"
    lrc=$?
    wait "$rp"
    return $lrc
}

# Two users log in, each with a client of their own.
login_as alice
expect_rc 0 $? "login alice"
expect_grep "web: authorized for user default/alice; the credentials are kept" \
    "$tmp/login.txt" "login alice"
login_as bob
expect_rc 0 $? "login bob"
expect_grep "web: authorized for user default/bob" "$tmp/login.txt" "login bob"
expect_count 2 "POST /register" "$tmp/oauth.log" "a registration per user"

# Each user's calls carry their own token, alternating, each refreshed
# first and saved back under its user only.
for who in alice bob alice bob; do
    case $who in alice) client=client-1 ;; *) client=client-2 ;; esac
    "$LOOM_BIN" mcp call $cfg --user "$who" web whoami >"$tmp/out" 2>"$tmp/err"
    expect_rc 0 $? "call as $who"
    expect_grep "hello $client" "$tmp/out" "call as $who"
done
expect_count 2 "^call client-1" "$tmp/oauth.log" "alice's calls"
expect_count 2 "^call client-2" "$tmp/oauth.log" "bob's calls"
expect_count 0 "refresh unknown" "$tmp/oauth.log" "refresh tokens"
if grep -q "^refresh client-1" "$tmp/oauth.log" &&
    grep -q "^refresh client-2" "$tmp/oauth.log"; then ok; else
    bad "each user's token was refreshed"; fi
sqlite3 "$tmp/data/loom.db" \
    "SELECT server || ' ' || user_id FROM mcp_credentials ORDER BY 1" \
    >"$tmp/rows"
printf 'web default/alice\nweb default/bob\n' >"$tmp/want"
if cmp -s "$tmp/rows" "$tmp/want"; then ok; else
    bad "stored rows:"; cat "$tmp/rows"; fi

# The same user named by its full id; not in another workspace.
"$LOOM_BIN" mcp call $cfg --user default/alice web whoami >"$tmp/out" 2>&1
expect_rc 0 $? "call as default/alice"
expect_grep "hello client-1" "$tmp/out" "call as default/alice"
"$LOOM_BIN" mcp call $cfg --user alice --workspace w2 web whoami \
    >"$tmp/out" 2>"$tmp/err"
expect_rc 1 $? "alice of w2"
expect_grep "loom mcp login web --user w2/alice" "$tmp/err" "alice of w2"

# A user without credentials is told how to connect; nothing is sent
# with anyone else's token.
"$LOOM_BIN" mcp call $cfg --user carol web whoami >"$tmp/out" 2>"$tmp/err"
expect_rc 1 $? "call as carol"
expect_grep "connect your account: \`loom mcp login web --user default/carol\`" \
    "$tmp/err" "call as carol"
expect_count 3 "^call client-1" "$tmp/oauth.log" "no call for carol"
expect_count 2 "^call client-2" "$tmp/oauth.log" "no call for carol"

# The server's own credentials are apart: none were made.
"$LOOM_BIN" mcp call $cfg web whoami >"$tmp/out" 2>"$tmp/err"
expect_rc 1 $? "call without a user"
expect_grep "run \`loom mcp login web\`" "$tmp/err" "call without a user"

# --db: another store has nobody's.
"$LOOM_BIN" mcp call $cfg --db "$tmp/data/other.db" --user alice web whoami \
    >"$tmp/out" 2>"$tmp/err"
expect_rc 1 $? "another store"
expect_grep "loom mcp login web --user default/alice" "$tmp/err" \
    "another store"

# Usage mistakes.
"$LOOM_BIN" mcp call $cfg --workspace w2 web whoami >"$tmp/out" 2>"$tmp/err"
expect_rc 2 $? "--workspace without --user"
"$LOOM_BIN" mcp login $cfg --user "a b" web >"$tmp/out" 2>"$tmp/err"
expect_rc 2 $? "a bad user"
expect_grep "not a valid user" "$tmp/err" "a bad user"

echo "$((checks - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]

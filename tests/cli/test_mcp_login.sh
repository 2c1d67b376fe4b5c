#!/bin/sh
# Shell tests of `loom mcp login` and of OAuth credentials kept in the
# store, against tests/mcp/fake_oauth_mcp.mjs (an MCP server with its own
# authorization server; curl plays the browser). Before login a call
# fails saying to log in; login prints the URL, ignores a callback with
# another state (400), and after the browser came back keeps the tokens
# sealed in the store (never in the database's clear text); a new process
# calls the tool with them, with no new registration; another key does
# not open them; a browser that never comes back ends login at its
# timeout; login refuses a stdio server.
set -u
: "${LOOM_BIN:?}"
: "${LOOM_SOURCE_DIR:?}"
fake_stdio="$(dirname "$LOOM_BIN")/loom-fake-mcp"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom-login-XXXXXX")
fails=0
checks=0
node_pid=
login_pid=
cleanup() {
    [ -n "$login_pid" ] && kill "$login_pid" 2>/dev/null
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

command -v node >/dev/null || { echo "node is needed"; exit 1; }
command -v curl >/dev/null || { echo "curl is needed"; exit 1; }
unset LOOM_SECRET_KEY http_proxy https_proxy HTTP_PROXY HTTPS_PROXY

# The fake prints its port once it listens.
mkfifo "$tmp/node.out"
FAKE_OAUTH_LOG="$tmp/oauth.log" node \
    "$LOOM_SOURCE_DIR/tests/mcp/fake_oauth_mcp.mjs" >"$tmp/node.out" &
node_pid=$!
read -r _ port <"$tmp/node.out"

cat >"$tmp/loom.yaml" <<YAML
server: {db: $tmp/data/loom.db}
mcp_servers:
  web: {url: "http://127.0.0.1:$port/mcp"}
  local: {command: $fake_stdio}
YAML
cfg="--config $tmp/loom.yaml"

# Before login: the call says what to do.
"$LOOM_BIN" mcp call $cfg web whoami >"$tmp/out" 2>"$tmp/err"
expect_rc 1 $? "call before login"
expect_grep "run \`loom mcp login web\`" "$tmp/err" "call before login"

# Login: read its output as it comes; tell the test once it waits.
mkfifo "$tmp/login.out" "$tmp/waiting"
"$LOOM_BIN" mcp login $cfg --timeout 60 web >"$tmp/login.out" \
    2>"$tmp/login.err" &
login_pid=$!
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
reader_pid=$!
read -r what <"$tmp/waiting"
if [ "$what" = go ]; then
    ok
    url=$(sed -n 's/^  \(http:.*\)$/\1/p' "$tmp/login.txt")
    back=$(sed -n 's|.*come back to \(http://127.0.0.1:[0-9]*/callback\).*|\1|p' \
        "$tmp/login.txt")
    expect_grep "open this URL in a browser" "$tmp/login.txt" "login prints"
    case $url in
    "http://127.0.0.1:$port/authorize?"*) ok ;;
    *) bad "login URL: '$url'" ;;
    esac
    # A callback with another state is turned away; login goes on.
    code=$(curl -s -o "$tmp/stray" -w '%{http_code}' \
        "$back?code=forged&state=not-the-one")
    expect_rc 400 "$code" "a callback with another state"
    code=$(curl -s -o /dev/null -w '%{http_code}' \
        "${back%/callback}/elsewhere")
    expect_rc 404 "$code" "another path"
    # The browser: the authorization server sends it back at once.
    curl -s -L --max-time 30 "$url" >"$tmp/browser"
    expect_grep "the authorization came back" "$tmp/browser" "browser page"
else
    bad "login never waited for the browser"
    cat "$tmp/login.err"
fi
wait "$login_pid"
expect_rc 0 $? "login"
login_pid=
wait "$reader_pid"
expect_grep "web: authorized; the credentials are kept in the store" \
    "$tmp/login.txt" "login"

# Kept sealed: a key file with mode 0600 beside the database, no token
# in the database.
if [ "$(stat -c %a "$tmp/data/loom.db.key")" = 600 ]; then ok; else
    bad "key file mode"; fi
if cat "$tmp"/data/loom.db* | grep -aq "tok-"; then
    bad "a token in the database's clear text"; else ok; fi

# A new process uses them: no new registration, no new authorization.
"$LOOM_BIN" mcp call $cfg web whoami >"$tmp/out" 2>"$tmp/err"
expect_rc 0 $? "call after login"
expect_grep "hello client-1" "$tmp/out" "call after login"
"$LOOM_BIN" mcp login $cfg web >"$tmp/out" 2>"$tmp/err"
expect_rc 0 $? "login again"
expect_grep "web: already authorized" "$tmp/out" "login again"
if [ "$(grep -c "POST /register" "$tmp/oauth.log")" -eq 1 ]; then ok; else
    bad "registered more than once"; fi

# Another key does not open them: the call is where it was before login.
LOOM_SECRET_KEY=another-key-altogether-0123456789 \
    "$LOOM_BIN" mcp call $cfg web whoami >"$tmp/out" 2>"$tmp/err"
expect_rc 1 $? "call with another key"
expect_grep "not readable" "$tmp/err" "call with another key"
expect_grep "run \`loom mcp login web\`" "$tmp/err" "call with another key"

# A browser that never comes back: login ends at its timeout.
sed "s|$tmp/data/loom.db|$tmp/data/other.db|" "$tmp/loom.yaml" \
    >"$tmp/other.yaml"
"$LOOM_BIN" mcp login --config "$tmp/other.yaml" --timeout 1 web \
    >"$tmp/out" 2>"$tmp/err"
expect_rc 1 $? "login timeout"
expect_grep "did not come back within 1 s" "$tmp/err" "login timeout"

# Usage mistakes.
"$LOOM_BIN" mcp login $cfg local >"$tmp/out" 2>"$tmp/err"
expect_rc 2 $? "login to a stdio server"
expect_grep "OAuth is for HTTP servers" "$tmp/err" "login to a stdio server"
"$LOOM_BIN" mcp login $cfg nosuch >"$tmp/out" 2>"$tmp/err"
expect_rc 2 $? "login to an unknown server"
"$LOOM_BIN" mcp login $cfg --timeout 0 web >"$tmp/out" 2>"$tmp/err"
expect_rc 2 $? "a bad timeout"

echo "$((checks - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]

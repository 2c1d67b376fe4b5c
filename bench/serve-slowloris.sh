#!/bin/sh
# Measures what a slow-loris from one address does to everyone else: the
# /healthz latency seen from 127.0.0.2 (one request after the other for
# DURATION seconds, each on a fresh connection)
# while nobody else is connected, then while 127.0.0.1 holds N half-open
# connections (a request line and one header sent, then silence). Two
# `loom serve` configs side by side: "before", the old front door
# (max_connections 1024, no per-address limit, the header timeout as long
# as read_timeout_ms, 30 s), and "after", the defaults (32768 connections,
# 256 per address, headers within 10 s). A request not answered within
# TIMEOUT counts as lost. Prints a Markdown table.
#
#   sh bench/serve-slowloris.sh
#
# Environment (defaults in brackets): N [1100] half-open connections,
# DURATION [20] seconds of /healthz requests per phase (shorter than the
# old 30 s timeout, which a real slow-loris outlasts by opening again what
# is closed, as this one does), TIMEOUT [2] seconds per request, LOOM
# [build/loom]. Every process listens on 127.0.0.1 only and
# is stopped by its pid on exit.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
LOOM=${LOOM:-$ROOT/build/loom}
N=${N:-1100}
DURATION=${DURATION:-20}
TIMEOUT=${TIMEOUT:-2}

say() { echo "serve-slowloris: $*" >&2; }
[ -x "$LOOM" ] || { say "no loom at $LOOM (build first)"; exit 1; }
command -v python3 >/dev/null || { say "needs python3"; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/loom-slowloris.XXXXXX")
PID=""
cleanup() {
    [ -n "$PID" ] && kill -TERM "$PID" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT

# The client: holds N half-open connections from 127.0.0.1 (or none),
# opening again each one the server closes, and times /healthz from
# 127.0.0.2. One line of JSON.
cat > "$TMP/client.py" <<'EOF'
import json, select, socket, sys, threading, time
port, n, duration, timeout = (int(a) if i < 2 else float(a)
                              for i, a in enumerate(sys.argv[1:5]))

def half_open():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.settimeout(5)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        return s
    except OSError:
        s.close()
        return None

# Like a real slow-loris, what the server closes is opened again, so the
# attack outlasts any timeout.
held = [s for s in (half_open() for _ in range(n)) if s]
stop = False
def keep():
    while not stop:
        p = select.poll()
        for s in held:
            p.register(s, select.POLLIN)
        gone = {fd for fd, _ in p.poll(0)}
        for i, s in enumerate(held):
            if s.fileno() in gone:
                s.close()
                t = half_open()
                held[i] = t if t else socket.socket()
        time.sleep(0.2)
keeper = threading.Thread(target=keep, daemon=True)
keeper.start()
time.sleep(1)  # let the server take them (the scenario, not a sync)
lat, lost, err = [], 0, None
end = time.perf_counter() + duration
while time.perf_counter() < end:
    t0 = time.perf_counter()
    s = socket.socket()
    s.bind(("127.0.0.2", 0))
    s.settimeout(timeout)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            b = s.recv(4096)
            if not b:
                break
            data += b
        if data.startswith(b"HTTP/1.1 200"):
            lat.append((time.perf_counter() - t0) * 1e3)
        else:
            lost += 1
    except OSError as e:
        lost += 1
        err = str(e)
    s.close()
lat.sort()
pct = lambda p: round(lat[min(len(lat) - 1, int(p * len(lat)))], 2) if lat else None
stop = True
print(json.dumps({"answered": len(lat), "lost": lost, "p50_ms": pct(0.5),
                  "p99_ms": pct(0.99), "error": err}))
EOF

# Starts loom with the server lines $1; sets PID and PORT.
start() {
    cat > "$TMP/loom.yaml" <<EOF
providers:
  p: {base_url: 'http://127.0.0.1:9', api_key: none}
server:
  listen: 127.0.0.1:0
  db: $TMP/loom.db
$1
EOF
    "$LOOM" serve --config "$TMP/loom.yaml" > "$TMP/out" 2> "$TMP/log" &
    PID=$!
    i=0
    PORT=""
    while [ -z "$PORT" ]; do
        i=$((i + 1))
        [ $i -lt 200 ] || { say "loom did not start"; cat "$TMP/log" >&2; exit 1; }
        sleep 0.05
        PORT=$(sed -n 's/^listening .*:\([0-9][0-9]*\)$/\1/p' "$TMP/out")
    done
}

stop() {
    kill -TERM "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
    PID=""
    rm -f "$TMP"/loom.db*
}

row() {
    python3 -c 'import json,sys; r=json.loads(sys.argv[3]); print("| %s | %s | %s/%s | %s | %s |" % (sys.argv[1], sys.argv[2], r["answered"], r["answered"]+r["lost"], r["p50_ms"], r["p99_ms"]))' "$@"
}

echo "| config | half-open from 127.0.0.1 | /healthz answered from 127.0.0.2 | p50 ms | p99 ms |"
echo "|---|---|---|---|---|"
for cfg in before after; do
    if [ $cfg = before ]; then
        lines="  max_connections: 1024
  max_connections_per_address: 0
  header_timeout_ms: 30000"
    else
        lines=""
    fi
    for held in 0 "$N"; do
        start "$lines"
        nice -n 5 python3 "$TMP/client.py" "$PORT" "$held" "$DURATION" \
            "$TIMEOUT" > "$TMP/r.json"
        row "$cfg" "$held" "$(cat "$TMP/r.json")"
        stop
    done
done

/*
 * The harness every peer shares, the JavaScript twin of bench/loop_bench.c:
 * it starts loom-fake-upstream with the same script loom-bench uses
 * (`loom-bench --print-script`), runs the peer's one-run function after a
 * warm-up, times each run on its own, reads GET /_fake/stats between runs
 * (outside the timed span, on a connection of its own) to subtract the
 * fake's busy time, checks that every run made the scripted number of
 * model calls and ended with the scripted text, and prints the same figures
 * as `loom-bench --json`, as one JSON line on stdout.
 *
 * Usage: node <peer>.mjs --fake PATH --script FILE [--runs N] [--warmup N]
 */
import { spawn } from 'node:child_process';
import http from 'node:http';
import { createInterface } from 'node:readline';
import { readFileSync } from 'node:fs';

export const FINAL_TEXT = 'Done: the no-op tool ran.';
export const PROMPT = 'Call the noop tool five times, then say done.';

function parseArgs(argv) {
  const o = { fake: null, script: null, runs: 1000, warmup: 50 };
  for (let i = 2; i < argv.length; i++) {
    const a = argv[i];
    const v = argv[i + 1];
    if (a === '--fake' && v) o.fake = argv[++i];
    else if (a === '--script' && v) o.script = argv[++i];
    else if (a === '--runs' && /^[1-9][0-9]*$/.test(v ?? ''))
      o.runs = Number(argv[++i]);
    else if (a === '--warmup' && /^[0-9]+$/.test(v ?? ''))
      o.warmup = Number(argv[++i]);
    else throw new Error(`bad argument: ${a}`);
  }
  if (!o.fake || !o.script)
    throw new Error('--fake PATH and --script FILE are required');
  return o;
}

/* Starts the fake and resolves with { proc, port } once it listens. */
function startFake(bin, script) {
  return new Promise((resolve, reject) => {
    const proc = spawn(bin, ['--script', script, '--max-seconds', '3600'], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const lines = createInterface({ input: proc.stdout });
    proc.once('error', reject);
    proc.once('exit', (code) => reject(new Error(`fake exited (${code})`)));
    lines.once('line', (line) => {
      const m = /^listening 127\.0\.0\.1:(\d+)$/.exec(line);
      if (!m) reject(new Error(`fake said: ${line}`));
      else resolve({ proc, port: Number(m[1]) });
    });
  });
}

/* GET /_fake/stats on a keep-alive agent of its own. */
function statsReader(port) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  return () =>
    new Promise((resolve, reject) => {
      const req = http.get(
        { host: '127.0.0.1', port, path: '/_fake/stats', agent },
        (res) => {
          let body = '';
          res.setEncoding('utf8');
          res.on('data', (d) => {
            body += d;
            if (body.length > 4096) req.destroy(new Error('stats too long'));
          });
          res.on('end', () => {
            try {
              const o = JSON.parse(body);
              resolve({ requests: o.requests, busyUs: o.busy_us });
            } catch (e) {
              reject(e);
            }
          });
        },
      );
      req.on('error', reject);
    });
}

/* Nearest-rank percentiles, like loop_bench.c's summarize(). */
function summarize(values) {
  const v = [...values].sort((a, b) => a - b);
  const n = v.length;
  const at = (p) => v[Math.ceil(p * n) - 1];
  return {
    p50: at(0.5),
    p99: at(0.99),
    mean: v.reduce((s, x) => s + x, 0) / n,
    min: v[0],
    max: v[n - 1],
  };
}

/*
 * Runs the benchmark. peer = { name, version, setup(baseURL) -> runOnce },
 * where runOnce() resolves with { text, modelCalls } of one whole run.
 */
export async function bench(peer) {
  const o = parseArgs(process.argv);
  const script = JSON.parse(readFileSync(o.script, 'utf8'));
  const callsPerRun = script.responses.length;
  const { proc, port } = await startFake(o.fake, o.script);
  proc.removeAllListeners('exit');
  const stats = statsReader(port);
  const runOnce = await peer.setup(`http://127.0.0.1:${port}/v1`);
  const check = (r) => {
    if (r.text !== FINAL_TEXT || r.modelCalls !== callsPerRun)
      throw new Error(
        `run went off script: ${r.modelCalls} model calls (want ` +
          `${callsPerRun}), text ${JSON.stringify(r.text)}`,
      );
  };
  try {
    for (let i = 0; i < o.warmup; i++) check(await runOnce());
    const own = [], wall = [], busy = [], cpu = [];
    let before = await stats();
    for (let i = 0; i < o.runs; i++) {
      const c0 = process.cpuUsage();
      const t0 = process.hrtime.bigint();
      const r = await runOnce();
      const t1 = process.hrtime.bigint();
      const c1 = process.cpuUsage(c0);
      check(r);
      const after = await stats();
      if (after.requests - before.requests !== callsPerRun)
        throw new Error(
          `the fake saw ${after.requests - before.requests} requests in a ` +
            `run, want ${callsPerRun}`,
        );
      wall.push(Number(t1 - t0) / 1e3);
      busy.push(after.busyUs - before.busyUs);
      own.push(wall[i] - busy[i]);
      cpu.push((c1.user + c1.system) / callsPerRun);
      before = after;
    }
    const perCall = (a) => a.map((x) => x / callsPerRun);
    const out = {
      name: peer.name,
      version: peer.version,
      node: process.version,
      runs: o.runs,
      warmup: o.warmup,
      model_calls_per_run: callsPerRun,
      tool_calls_per_run: callsPerRun - 1,
      own_us: { per_call: summarize(perCall(own)), per_run: summarize(own) },
      wall_us: { per_call: summarize(perCall(wall)), per_run: summarize(wall) },
      fake_busy_us_per_run: summarize(busy),
      cpu_us_per_call: summarize(cpu),
    };
    process.stdout.write(JSON.stringify(out) + '\n');
  } finally {
    proc.kill('SIGTERM');
  }
}

export function versionOf(pkg) {
  const url = new URL(`./node_modules/${pkg}/package.json`, import.meta.url);
  return JSON.parse(readFileSync(url, 'utf8')).version;
}

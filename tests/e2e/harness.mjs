/*
 * harness.mjs: starts what an end-to-end test talks to and stops it again.
 *
 * A Stack is a temporary folder holding one or more loom-fake-upstream
 * processes (one per scripted provider, each on a free 127.0.0.1 port), a
 * YAML config naming them as providers `<name>` (kind openai), and one
 * `loom serve` on a free 127.0.0.1 port with its SQLite database in the
 * folder. Tests use stack.client() (the official openai SDK pointed at the
 * server), stack.get() for loom's own endpoints and stack.fakeRequests()
 * for what loom sent upstream.
 *
 * Binaries: $LOOM_BIN and $LOOM_FAKE_BIN (scripts/e2e.sh sets both), else
 * <repo>/build/loom and <repo>/build/loom-fake-upstream.
 *
 * Every process started leads a process group of its own (what it starts,
 * such as loom's MCP servers, is in that group) and is remembered until
 * it has exited. stack.close() (call it from an `after` hook) stops loom
 * and the fakes with SIGTERM, SIGKILLs whatever does not exit in time,
 * then SIGKILLs each group (anything left of it), removes the folder, and
 * throws when a process ended during the test (other than by killLoom) or
 * did not stop cleanly (exit status 0), so a crash or a sanitizer report
 * fails the suite. Each of those steps runs even when another one failed,
 * so a failed close leaves no handle that would keep the test file's
 * process alive. Any group still running when the test process exits (a
 * test that threw before its hook ran) is SIGKILLed by an exit handler,
 * also when the process is ended by SIGTERM, SIGINT or SIGHUP (the test
 * runner's timeout, scripts/e2e.sh's time limit); the fakes also exit by
 * themselves after --max-seconds.
 *
 * teardown(steps) is that "every step runs, then report" for test hooks:
 * closing a browser, a stack and a server of the test's own in one after()
 * (closeServer() closes such a server with its open connections).
 */
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..', '..');

export const LOOM_BIN =
    process.env.LOOM_BIN || path.join(repo, 'build', 'loom');
export const FAKE_BIN =
    process.env.LOOM_FAKE_BIN || path.join(repo, 'build', 'loom-fake-upstream');

/* The key every provider is configured with; the fake records it. */
export const API_KEY = 'e2e-upstream-key';

const STDERR_KEEP = 64 * 1024;    /* bytes of a process's stderr kept */
const START_TIMEOUT_MS = 15000;   /* until the "listening" line */
const STOP_TIMEOUT_MS = 15000;    /* SIGTERM until exit, then SIGKILL */
const FAKE_MAX_SECONDS = 180;     /* a leaked fake ends itself */

const live = new Set();

/* SIGKILL of a process group; quiet when it is gone already. */
function killGroup(pid, signal = 'SIGKILL') {
    if (!pid)
        return;
    try {
        process.kill(-pid, signal);
    } catch {
        /* ESRCH: nothing left of it */
    }
}

process.on('exit', () => {
    for (const child of live)
        killGroup(child.pid);
});
/* A signal's default action would skip the exit handler and leave the
 * groups running: exit instead, with the status the signal would give. */
for (const [signal, number] of [['SIGTERM', 15], ['SIGINT', 2],
                                ['SIGHUP', 1]])
    process.on(signal, () => process.exit(128 + number));

/*
 * spawn() of a process that leads a process group of its own, SIGKILLed
 * with its group by the exit handler if still running when the test
 * process ends. For processes a test starts itself; Stack starts its own.
 */
export function spawnGroup(bin, args, options = {}) {
    const child = spawn(bin, args, { ...options, detached: true });
    live.add(child);
    child.on('exit', () => live.delete(child));
    child.on('error', () => live.delete(child));
    return child;
}

/*
 * Runs every step (a function, maybe async) in order, each one also when
 * an earlier one threw, then throws one Error naming every failure (their
 * messages joined), or resolves when none failed. A step may be null
 * (nothing to do).
 */
export async function teardown(steps) {
    const errors = [];
    for (const step of steps) {
        if (!step)
            continue;
        try {
            await step();
        } catch (err) {
            errors.push(err);
        }
    }
    if (errors.length === 1)
        throw errors[0];
    if (errors.length)
        throw new Error(errors.map((e) => e?.stack ?? String(e))
            .join('\n'));
}

/* A child process whose stdout announces "listening 127.0.0.1:PORT". */
class Proc {
    constructor(name, bin, args, env) {
        this.name = name;
        this.stderr = '';
        this.exited = null; /* {code, signal} once it has exited */
        this.child = spawnGroup(bin, args, {
            stdio: ['ignore', 'pipe', 'pipe'],
            env: { ...process.env, ...env },
        });
        this.exit = new Promise((resolve) => {
            this.child.on('exit', (code, signal) => {
                this.exited = { code, signal };
                resolve(this.exited);
            });
            this.child.on('error', (err) => {
                this.stderr += `spawn ${bin}: ${err.message}\n`;
                this.exited = { code: -1, signal: null };
                resolve(this.exited);
            });
        });
        this.child.stderr.setEncoding('utf8');
        this.child.stderr.on('data', (s) => {
            this.stderr = (this.stderr + s).slice(-STDERR_KEEP);
        });
    }

    /* Resolves with the port of the "listening HOST:PORT" line. */
    listening() {
        return new Promise((resolve, reject) => {
            let out = '';
            const fail = (why) => {
                clearTimeout(timer);
                reject(new Error(`${this.name}: ${why}\n${this.stderr}`));
            };
            const timer = setTimeout(
                () => fail(`no "listening" line in ${START_TIMEOUT_MS} ms`),
                START_TIMEOUT_MS);
            this.child.stdout.setEncoding('utf8');
            this.child.stdout.on('data', (s) => {
                out += s;
                const m = /^listening 127\.0\.0\.1:(\d+)$/m.exec(out);
                if (m) {
                    clearTimeout(timer);
                    resolve(Number(m[1]));
                }
            });
            this.exit.then((e) => fail(
                `exited before listening (code ${e.code}, signal ${e.signal})`));
        });
    }

    /* SIGTERM, wait, SIGKILL if needed; resolves with how it exited. */
    async stop() {
        if (this.exited)
            return this.exited;
        this.child.kill('SIGTERM');
        let timer;
        const late = new Promise((resolve) => {
            timer = setTimeout(resolve, STOP_TIMEOUT_MS, 'late');
        });
        const r = await Promise.race([this.exit, late]);
        clearTimeout(timer);
        if (r === 'late') {
            killGroup(this.child.pid);
            await this.exit;
            return { code: null, signal: 'SIGKILL', late: true };
        }
        return r;
    }

    /* SIGKILL of what is left of its process group (the process itself
     * when still running, whatever it started and left behind). */
    killGroup() {
        killGroup(this.child.pid);
    }

    /* kill -9, and wait until it is gone. */
    async kill9() {
        this.killedOnPurpose = true;
        if (!this.exited)
            this.child.kill('SIGKILL');
        return this.exit;
    }
}

function tempRoot() {
    const base = process.env.LOOM_TEST_TMP || os.tmpdir();
    fs.mkdirSync(base, { recursive: true });
    return fs.mkdtempSync(path.join(base, 'loom-e2e-'));
}

/* The YAML config: one provider per fake, the models, the agents, plus
 * the server section. The database path is written as a JSON string,
 * which YAML reads as a double-quoted scalar, so any folder name works
 * (JSON is YAML: the models and agents are written so too). */
function configYaml(stack, server, agents, models, auth, mcp, tools) {
    const lines = ['log:', '  level: warn', 'providers:'];
    for (const [name, f] of Object.entries(stack.fakes)) {
        const retries = f.retries ?? 0;
        lines.push(
            `  ${name}:`,
            '    kind: openai',
            `    base_url: http://127.0.0.1:${f.port}/v1`,
            `    api_key: ${API_KEY}`,
            '    timeouts:',
            '      connect_ms: 5000',
            '      first_byte_ms: 60000',
            '      idle_ms: 60000',
            '    retries:',
            `      max: ${retries}`,
            '      base_delay_ms: 1',
            '      max_delay_ms: 20');
    }
    if (models)
        lines.push(`models: ${JSON.stringify(models)}`);
    if (agents)
        lines.push(`agents: ${JSON.stringify(agents)}`);
    if (mcp)
        lines.push(`mcp_servers: ${JSON.stringify(mcp)}`);
    if (tools)
        lines.push(`tools: ${JSON.stringify(tools)}`);
    lines.push('server:',
               '  listen: 127.0.0.1:0',
               `  db: ${JSON.stringify(stack.db)}`);
    for (const [k, v] of Object.entries(server ?? {}))
        lines.push(`  ${k}: ${v}`);
    if (auth)
        lines.push(`auth: ${JSON.stringify(auth)}`);
    return lines.join('\n') + '\n';
}

export class Stack {
    /*
     * fakes: {providerName: script object, or {script, retries}} where
     * script is the fake's JSON script (docs/fake-upstream.md) and retries
     * loom's retries.max for that provider (default 0). server: extra
     * keys of the config's server: section. agents: the config's agents:
     * section as an object ({name: {model, tools, ...}}). models: the
     * config's models: section ({'provider/model': {capabilities, ...}}).
     * auth: the config's auth: section ({mode: 'keys', ...}). mcp: the
     * config's mcp_servers: section ({name: {command, args, ...}}).
     * tools: the config's tools: section ({web_search: {...}, ...}).
     */
    static async start({ fakes, server, agents, models, auth, mcp,
                         tools } = {}) {
        const s = new Stack();
        try {
            for (const [name, spec] of Object.entries(fakes ?? {}))
                await s.startFake(name, spec.script ? spec : { script: spec });
            fs.writeFileSync(s.configPath,
                             configYaml(s, server, agents, models, auth, mcp,
                                        tools));
            await s.startLoom();
        } catch (err) {
            await s.close().catch(() => {});
            throw err;
        }
        return s;
    }

    constructor() {
        this.dir = tempRoot();
        this.db = path.join(this.dir, 'loom.db');
        this.configPath = path.join(this.dir, 'loom.yaml');
        this.fakes = {};
        this.loom = null;
        this.stopped = []; /* problems seen when processes ended */
    }

    async startFake(name, { script, retries }) {
        const scriptPath = path.join(this.dir, `${name}.script.json`);
        const record = path.join(this.dir, `${name}.requests.jsonl`);
        fs.writeFileSync(scriptPath, JSON.stringify(script));
        const proc = new Proc(`fake ${name}`, FAKE_BIN, [
            '--port', '0', '--script', scriptPath, '--record', record,
            '--max-seconds', String(FAKE_MAX_SECONDS)]);
        this.fakes[name] = { proc, record, retries, port: 0 };
        this.fakes[name].port = await proc.listening();
    }

    /* Starts `loom serve` on the stack's config and database. */
    async startLoom() {
        if (this.loom && !this.loom.exited)
            throw new Error('loom is already running');
        this.loom = new Proc('loom serve', LOOM_BIN, [
            'serve', '--config', this.configPath, '--listen', '127.0.0.1:0',
            '--db', this.db, '--log-level', 'warn']);
        this.port = await this.loom.listening();
        this.baseURL = `http://127.0.0.1:${this.port}`;
        return this.port;
    }

    /* kill -9 of loom (no graceful stop, no chance to write anything). */
    async killLoom() {
        const e = await this.loom.kill9();
        if (e.signal !== 'SIGKILL')
            throw new Error(`loom exited on its own before the kill: ` +
                            `${JSON.stringify(e)}\n${this.loom.stderr}`);
    }

    /* `loom keys ARGS --db <the stack's db>`: its stdout. */
    keys(...args) {
        return execFileSync(LOOM_BIN, ['keys', ...args, '--db', this.db],
                            { encoding: 'utf8' });
    }

    /* The official SDK, pointed at loom; no retries of its own. */
    client(opts = {}) {
        return new OpenAI({
            baseURL: `${this.baseURL}/v1`,
            apiKey: 'e2e-client-key',
            maxRetries: 0,
            timeout: 60000,
            ...opts,
        });
    }

    /* GET a path of loom's own API: {status, headers, body (parsed)}. */
    async get(p) {
        const res = await fetch(`${this.baseURL}${p}`, {
            signal: AbortSignal.timeout(30000),
        });
        const text = await res.text();
        let body;
        try {
            body = JSON.parse(text);
        } catch {
            body = text;
        }
        return { status: res.status, headers: res.headers, body };
    }

    /* What loom sent to the fake provider `name`, one object a request. */
    fakeRequests(name) {
        const f = this.fakes[name];
        if (!fs.existsSync(f.record))
            return [];
        return fs.readFileSync(f.record, 'utf8').split('\n')
            .filter((l) => l.trim()).map((l) => JSON.parse(l));
    }

    /* The last part of loom's stderr, for failure messages. */
    loomLog() {
        return this.loom ? this.loom.stderr : '';
    }

    /* Stops everything, every step also when another failed; throws
     * when something did not exit cleanly or a step failed. */
    async close() {
        const procs = [];
        if (this.loom)
            procs.push(this.loom);
        for (const f of Object.values(this.fakes))
            procs.push(f.proc);
        const problems = [];
        const stop = (p) => async () => {
            if (p.killedOnPurpose)
                return;
            if (p.exited) {
                problems.push(`${p.name} exited during the test ` +
                              `(${JSON.stringify(p.exited)}):\n${p.stderr}`);
                return;
            }
            const e = await p.stop();
            if (e.code !== 0 || e.late)
                problems.push(`${p.name} did not stop cleanly ` +
                              `(${JSON.stringify(e)}):\n${p.stderr}`);
        };
        await teardown([
            ...procs.map(stop),
            ...procs.map((p) => () => p.killGroup()),
            () => {
                if (!process.env.LOOM_E2E_KEEP)
                    fs.rmSync(this.dir, { recursive: true, force: true });
            },
            () => {
                if (problems.length)
                    throw new Error(problems.join('\n'));
            },
        ]);
    }
}

/* Closes an http.Server a test started: the listener and every
 * connection still open (a client's keep-alive ones would otherwise keep
 * the test process alive); resolves once it is closed. */
export function closeServer(server) {
    return new Promise((resolve, reject) => {
        server.close((err) => (err ? reject(err) : resolve()));
        server.closeAllConnections();
    });
}

/* Runs fn over items with at most `limit` calls in flight. */
export async function mapLimit(items, limit, fn) {
    const out = new Array(items.length);
    let next = 0;
    async function worker() {
        while (next < items.length) {
            const i = next++;
            out[i] = await fn(items[i], i);
        }
    }
    await Promise.all(Array.from({ length: Math.min(limit, items.length) },
                                 worker));
    return out;
}

/* A fake script response that streams `pieces` of text; its usage says
 * 10 prompt tokens and one completion token a piece. */
export function textResponse(pieces, extra = {}) {
    const completion = pieces.length;
    return {
        text: pieces,
        usage: { prompt_tokens: 10, completion_tokens: completion,
                 total_tokens: 10 + completion },
        ...extra,
    };
}

/*
 * The harness's teardown releases everything, also when it fails: a
 * stand-in for `loom serve` (teardown-child.mjs) that leaves a process of
 * its own running and exits 1 with a leak report on SIGTERM, as an ASan
 * build with a leak does. The test file's process (another
 * teardown-child.mjs) must report the failure and still exit by itself
 * with nothing of the stack left running, its own http server and a
 * keep-alive connection to it closed; and a test process ended by SIGTERM
 * (what the test runner's timeout sends) must take the stack with it.
 * Before, such a failed close left the file's process running for ever
 * and the whole suite waiting for it.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { spawnGroup } from './harness.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const CHILD = path.join(here, 'teardown-child.mjs');
const TIMEOUT = { timeout: 60000 };

/* True once pid is gone: no such process, or a zombie (dead, only not
 * yet reaped by whoever adopted it). */
function gone(pid) {
    try {
        const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
        return stat.slice(stat.lastIndexOf(')') + 2)[0] === 'Z';
    } catch {
        return true;
    }
}

/* Starts teardown-child.mjs ROLE as a test file's process with the
 * stand-in as LOOM_BIN: {child, pids (a promise of its first stdout
 * line, parsed), exit (a promise of {code, signal, stderr})}. */
function startChild(role) {
    const child = spawnGroup(process.execPath, [CHILD, role], {
        stdio: ['ignore', 'pipe', 'pipe'],
        env: { ...process.env, LOOM_BIN: CHILD },
    });
    let out = '';
    let err = '';
    child.stdout.setEncoding('utf8');
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (s) => { err += s; });
    const exit = new Promise((resolve) => child.on('exit', (code, signal) =>
        resolve({ code, signal, stderr: err })));
    const pids = new Promise((resolve, reject) => {
        child.stdout.on('data', (s) => {
            out += s;
            const nl = out.indexOf('\n');
            if (nl >= 0)
                resolve(JSON.parse(out.slice(0, nl)));
        });
        exit.then((e) => reject(new Error(
            `the child exited first (${e.code}, ${e.signal}):\n${e.stderr}`)));
    });
    return { child, pids, exit };
}

/* Resolves once every pid is gone, checking every 20 ms; rejects after
 * 15 s (a condition waited on, never a fixed sleep). */
async function allGone(pids) {
    const end = Date.now() + 15000;
    while (!Object.values(pids).every(gone)) {
        if (Date.now() > end)
            throw new Error(`still running: ${JSON.stringify(pids)}`);
        await new Promise((r) => setTimeout(r, 20));
    }
}

describe('harness teardown', () => {
    const started = [];
    after(() => {
        for (const c of started)
            if (c.exitCode === null && c.signalCode === null)
                process.kill(-c.pid, 'SIGKILL');
    });

    test('a server exiting 1 at close fails the teardown, and the test ' +
         'process still exits with nothing left', TIMEOUT, async () => {
        const run = startChild('close');
        started.push(run.child);
        const pids = await run.pids;
        const e = await run.exit;
        assert.equal(e.code, 1, e.stderr);
        assert.match(e.stderr, /teardown failed: loom serve did not stop /);
        assert.match(e.stderr, /LeakSanitizer: detected memory leaks/);
        await allGone(pids);
    });

    test('SIGTERM to the test process takes its stack with it', TIMEOUT,
         async () => {
        const run = startChild('hold');
        started.push(run.child);
        const pids = await run.pids;
        assert.ok(!gone(pids.loom) && !gone(pids.grandchild));
        run.child.kill('SIGTERM');
        const e = await run.exit;
        assert.equal(e.code, 143, e.stderr);
        await allGone(pids);
    });
});

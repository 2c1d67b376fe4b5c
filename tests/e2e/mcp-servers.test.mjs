/*
 * loom's MCP client against the reference MCP servers from npm (pinned in
 * package-lock.json, run from node_modules: nothing is downloaded at test
 * time): @modelcontextprotocol/server-everything over stdio and over
 * Streamable HTTP, and @modelcontextprotocol/server-filesystem over stdio
 * on a temporary folder. A scripted model (the fake upstream, its rules
 * choosing each answer by the prompt) calls their tools through `loom
 * run --json` and through `loom serve`'s run API: `loom mcp list` shows
 * every server ready with its tools, an image result (described to a
 * model without vision, sent as an image to one with), structured content
 * checked against the tool's outputSchema, resource links and an
 * embedded resource, progress notifications as tool.progress events, a
 * long-running call cancelled (the server gets notifications/cancelled
 * for the running request and the run ends cancelled, long before the
 * call would have), and the filesystem server's list_directory and
 * read_file. The servers run with mcp-spy.mjs preloaded, which notes the
 * cancels they receive and keeps the HTTP one on 127.0.0.1.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { LOOM_BIN, Stack, spawnGroup, textResponse } from './harness.mjs';

const TIMEOUT = { timeout: 60000 };
const here = path.dirname(fileURLToPath(import.meta.url));
const NODE = process.execPath;
const SPY = path.join(here, 'mcp-spy.mjs');
const serverJs = (name) => path.join(here, 'node_modules', '@modelcontextprotocol',
                                     name, 'dist', 'index.js');
const EVERYTHING = serverJs('server-everything');
const FILESYSTEM = serverJs('server-filesystem');

/* The two ways in: the `loom run` CLI and `loom serve`'s run API. */
const CLIENTS = ['run', 'serve'];
/* server-everything's two transports, as two servers of the config. */
const VIAS = ['everything', 'everything_http'];

const call = (id, name, args) => ({ id, name, arguments: JSON.stringify(args) });

/* A rule answering the prompt `marker`: the calls, then `answer`. */
function rule(marker, calls, answer = 'Done.') {
    return { match: { first_user: marker },
             responses: [{ tool_calls: calls }, textResponse([answer])] };
}

function script(filesDir) {
    const rules = [];
    for (const via of VIAS) {
        for (const c of CLIENTS) {
            const k = `${via}_${c}`;
            rules.push(
                rule(`image ${k}.`,
                     [call(`img_${k}`, `${via}__get-tiny-image`, {})],
                     'I see the MCP logo.'),
                rule(`progress ${k}.`,
                     [call(`prog_${k}`, `${via}__trigger-long-running-operation`,
                           { duration: 0.3, steps: 3 })]),
                rule(`cancel ${k}.`,
                     [call(`long_${k}`, `${via}__trigger-long-running-operation`,
                           { duration: 600, steps: 600 })]),
                rule(`results ${k}.`,
                     [call(`st_${k}`, `${via}__get-structured-content`,
                           { location: 'Chicago' }),
                      call(`links_${k}`, `${via}__get-resource-links`,
                           { count: 2 }),
                      call(`ref_${k}`, `${via}__get-resource-reference`,
                           { resourceType: 'Text', resourceId: 1 })]));
        }
    }
    rules.push(rule('image eye.',
                    [call('img_eye', 'everything__get-tiny-image', {})],
                    'I see the MCP logo.'));
    for (const c of CLIENTS)
        rules.push(rule(`files ${c}.`,
                        [call(`ls_${c}`, 'files__list_directory',
                              { path: filesDir }),
                         call(`cat_${c}`, 'files__read_file',
                              { path: path.join(filesDir, 'notes.txt') })],
                        'The notes say hello.'));
    return { rules };
}

/* Resolves when cond() is true, checking every 20 ms, or rejects after
 * ms (a condition waited on, never a fixed sleep). */
async function waitFor(cond, ms, what) {
    const end = Date.now() + ms;
    while (!cond()) {
        if (Date.now() > end)
            throw new Error(`timed out waiting for ${what}`);
        await new Promise((r) => setTimeout(r, 20));
    }
}

/* server-everything over Streamable HTTP on a free 127.0.0.1 port; it
 * exits when we close its stdin (or after 300 s). */
async function startHttpEverything(spyLog) {
    const child = spawnGroup(NODE, ['--import', SPY, EVERYTHING, 'streamableHttp'], {
        stdio: ['pipe', 'ignore', 'pipe'],
        env: { ...process.env, PORT: '0', MCP_SPY_LOG: spyLog,
               MCP_SPY_EXIT_ON_EOF: '1', MCP_SPY_MAX_SECONDS: '300' },
    });
    const exited = new Promise((r) => child.on('exit', r));
    let err = '';
    child.stderr.setEncoding('utf8');
    const port = await new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(
            `server-everything did not listen:\n${err}`)), 15000);
        child.stderr.on('data', (s) => {
            err = (err + s).slice(-16384);
            const m = /mcp-spy: listening 127\.0\.0\.1:(\d+)/.exec(err);
            if (m) {
                clearTimeout(timer);
                resolve(Number(m[1]));
            }
        });
        exited.then(() => reject(new Error(
            `server-everything exited before listening:\n${err}`)));
    });
    return { port, stop: async () => { child.stdin.end(); await exited; } };
}

/* `loom run --json` of an agent (default `mcp`): its events and exit
 * code. With cancelOn, the first event it matches gets the run a SIGINT
 * (Ctrl-C). */
function loomRun(stack, prompt, cancelOn, agent = 'mcp') {
    return new Promise((resolve) => {
        const child = spawnGroup(LOOM_BIN,
                                 ['run', '--config', stack.configPath,
                                  '--agent', agent, '--json', prompt],
                                 { stdio: ['ignore', 'pipe', 'pipe'] });
        const events = [];
        let out = '', err = '', sent = false;
        child.stdout.setEncoding('utf8');
        child.stderr.setEncoding('utf8');
        child.stderr.on('data', (s) => { err = (err + s).slice(-16384); });
        child.stdout.on('data', (s) => {
            out += s;
            let nl;
            while ((nl = out.indexOf('\n')) >= 0) {
                const line = out.slice(0, nl);
                out = out.slice(nl + 1);
                if (!line.trim())
                    continue;
                const ev = JSON.parse(line);
                events.push(ev);
                if (cancelOn && !sent && cancelOn(ev)) {
                    sent = true;
                    child.kill('SIGINT');
                }
            }
        });
        child.on('exit', (code) => resolve({ code, events, stderr: err }));
    });
}

/* A streamed POST /v1/runs of the agent `mcp`: its events. With
 * cancelOn, the first event it matches gets the run cancelled through
 * POST /v1/runs/{id}/cancel, whose answer is returned as `cancel`. */
async function serveRun(stack, prompt, cancelOn) {
    const res = await fetch(`${stack.baseURL}/v1/runs`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ agent: 'mcp', input: prompt, stream: true }),
        signal: AbortSignal.timeout(60000),
    });
    assert.equal(res.status, 200, await (res.ok ? '' : res.text()));
    const runId = res.headers.get('x-loom-run-id');
    const events = [];
    const decoder = new TextDecoder();
    let buf = '', cancel = null, cancelling = null;
    for await (const chunk of res.body) {
        buf += decoder.decode(chunk, { stream: true });
        let end;
        while ((end = buf.indexOf('\n\n')) >= 0) {
            const block = buf.slice(0, end);
            buf = buf.slice(end + 2);
            const data = block.split('\n').filter((l) => l.startsWith('data: '))
                .map((l) => l.slice(6)).join('\n');
            if (!data)
                continue;
            const ev = JSON.parse(data);
            events.push(ev);
            if (cancelOn && !cancelling && cancelOn(ev))
                cancelling = fetch(`${stack.baseURL}/v1/runs/${runId}/cancel`,
                                   { method: 'POST',
                                     signal: AbortSignal.timeout(30000) })
                    .then(async (r) => { cancel = { status: r.status,
                                                    body: await r.json() }; });
        }
    }
    if (cancelling)
        await cancelling;
    return { events, runId, cancel };
}

function drive(stack, client, prompt, cancelOn) {
    return client === 'run' ? loomRun(stack, prompt, cancelOn)
                            : serveRun(stack, prompt, cancelOn);
}

const last = (events) => events[events.length - 1];
const ofType = (events, type) => events.filter((e) => e.type === type);
const completedCall = (events, id) =>
    ofType(events, 'tool.completed').find((e) => e.id === id);

/* The tool message answering call id in what loom sent the model. */
function toolMessage(stack, id) {
    for (const r of stack.fakeRequests('mcp'))
        for (const m of r.body?.messages ?? [])
            if (m.role === 'tool' && m.tool_call_id === id)
                return m;
    return null;
}

function spyLines(file) {
    return fs.existsSync(file)
        ? fs.readFileSync(file, 'utf8').split('\n').filter((l) => l) : [];
}

describe('MCP servers from npm', () => {
    let stack, http, dir, filesDir;
    const spyLogs = {};

    before(async () => {
        dir = fs.mkdtempSync(path.join(os.tmpdir(), 'loom-e2e-mcp-'));
        filesDir = path.join(dir, 'files');
        fs.mkdirSync(path.join(filesDir, 'sub'), { recursive: true });
        fs.writeFileSync(path.join(filesDir, 'notes.txt'),
                         'The notes say: hello from the filesystem.\n');
        spyLogs.everything = path.join(dir, 'stdio-spy.log');
        spyLogs.everything_http = path.join(dir, 'http-spy.log');
        http = await startHttpEverything(spyLogs.everything_http);
        stack = await Stack.start({
            fakes: { mcp: script(filesDir) },
            models: { 'mcp/eye-model': { capabilities: { vision: true } } },
            agents: { mcp: { model: 'mcp/fake-model',
                             tools: ['everything__*', 'everything_http__*',
                                     'files__*'] },
                      mcp_eye: { model: 'mcp/eye-model',
                                 tools: ['everything__*'] } },
            mcp: {
                everything: { command: NODE,
                              args: ['--import', SPY, EVERYTHING, 'stdio'],
                              env: { MCP_SPY_LOG: spyLogs.everything } },
                everything_http: { url: `http://127.0.0.1:${http.port}/mcp` },
                files: { command: NODE, args: [FILESYSTEM, filesDir],
                         tools: ['read_file', 'list_directory'] },
            },
        });
    });

    after(async () => {
        try {
            await stack?.close();
        } finally {
            await http?.stop();
            fs.rmSync(dir, { recursive: true, force: true });
        }
    });

    /* `loom mcp list ARGS --config <the stack's>`: its stdout. */
    const mcpList = (...args) => new Promise((resolve, reject) => {
        execFile(LOOM_BIN, ['mcp', 'list', '--config', stack.configPath,
                            ...args], { timeout: 60000 },
                 (e, stdout, stderr) => (e ? reject(new Error(
                     `${e.message}\n${stderr}`)) : resolve(stdout)));
    });

    test('loom mcp list shows every server ready with its tools', TIMEOUT,
         async () => {
        const servers = JSON.parse(await mcpList('--json'));
        const byName = Object.fromEntries(servers.map((s) => [s.name, s]));
        for (const name of [...VIAS, 'files']) {
            assert.equal(byName[name]?.state, 'ready',
                         `${name}: ${JSON.stringify(byName[name])}`);
            assert.equal(byName[name].protocol_version, '2025-11-25');
        }
        assert.equal(byName.everything.transport, 'stdio');
        assert.equal(byName.everything_http.transport, 'http');
        const names = (s) => s.tools.map((t) => t.name).sort();
        /* Every tool the server lists to a client that declares no
         * sampling, elicitation or roots (it adds tools for those), in
         * one tools/list page: this server does not page. */
        const everything = [
            'echo', 'get-annotated-message', 'get-env',
            'get-resource-links', 'get-resource-reference',
            'get-structured-content', 'get-sum', 'get-tiny-image',
            'gzip-file-as-resource', 'simulate-research-query',
            'toggle-simulated-logging', 'toggle-subscriber-updates',
            'trigger-long-running-operation'];
        for (const via of VIAS)
            assert.deepEqual(names(byName[via]), everything);
        /* The allow-list keeps two of the filesystem server's tools. */
        assert.deepEqual(names(byName.files), ['list_directory', 'read_file']);
        /* The text form names them as the model sees them. */
        const text = await mcpList();
        assert.match(text, /^everything_http \(http\): ready, protocol 2025-11-25$/m);
        assert.match(text, /^ {2}everything__get-tiny-image {2}Returns a tiny MCP logo image\.$/m);
        assert.match(text, /^ {2}files__read_file {2}/m);
    });

    test('a model with vision gets the image itself', TIMEOUT, async () => {
        const { events } = await loomRun(stack, 'image eye.', null, 'mcp_eye');
        assert.equal(last(events).type, 'run.completed',
                     JSON.stringify(last(events)));
        const done = completedCall(events, 'img_eye');
        assert.ok(done, JSON.stringify(events));
        /* The text still describes it; the image follows the results as
         * a user message (Chat Completions' tool messages hold text). */
        assert.match(done.output, /\[image: image\/png, about \d+ bytes\]/);
        const req = stack.fakeRequests('mcp').find((r) =>
            (r.body?.messages ?? []).some((m) => m.tool_call_id === 'img_eye'));
        assert.ok(req, 'no request with the result');
        const msgs = req.body.messages;
        const at = msgs.findIndex((m) => m.tool_call_id === 'img_eye');
        assert.equal(msgs[at].content, done.output);
        const after = msgs[at + 1];
        assert.equal(after.role, 'user');
        assert.equal(after.content[0].text,
                     'The images that tool call img_eye ' +
                     '(everything__get-tiny-image) gave with its result:');
        assert.match(after.content[1].image_url.url,
                     /^data:image\/png;base64,[A-Za-z0-9+/]+=*$/);
    });

    for (const via of VIAS) {
        for (const client of CLIENTS) {
            const k = `${via}_${client}`;

            test(`${via} through loom ${client}: an image result`, TIMEOUT,
                 async () => {
                const { events } = await drive(stack, client, `image ${k}.`);
                assert.equal(last(events).type, 'run.completed',
                             JSON.stringify(last(events)));
                assert.equal(last(events).text, 'I see the MCP logo.');
                const done = completedCall(events, `img_${k}`);
                assert.ok(done, JSON.stringify(events));
                /* The model has no vision: the image is described, between
                 * the texts around it. */
                assert.match(done.output,
                             /^Here's the image you requested:\n\n\[image: image\/png, about \d+ bytes\]\n\nThe image above is the MCP logo\.$/);
                assert.equal(toolMessage(stack, `img_${k}`).content,
                             done.output);
            });

            test(`${via} through loom ${client}: progress`, TIMEOUT,
                 async () => {
                const { events } = await drive(stack, client, `progress ${k}.`);
                assert.equal(last(events).type, 'run.completed',
                             JSON.stringify(last(events)));
                const steps = ofType(events, 'tool.progress')
                    .filter((e) => e.call_id === `prog_${k}`);
                assert.deepEqual(steps.map((e) => e.label),
                                 ['1 of 3', '2 of 3', '3 of 3']);
                assert.ok(steps.every((e) => e.status === 'running'));
                const done = completedCall(events, `prog_${k}`);
                assert.match(done.output,
                             /^Long running operation completed\. Duration: 0\.3 seconds, Steps: 3\.$/);
            });

            test(`${via} through loom ${client}: a long call cancelled`,
                 TIMEOUT, async () => {
                const before = spyLines(spyLogs[via]).length;
                /* Cancelled once the call is surely running at the server:
                 * its first progress step came. The call would take 600 s;
                 * the test's 60 s timeout proves the run ends promptly. */
                const r = await drive(stack, client, `cancel ${k}.`,
                                      (e) => e.type === 'tool.progress' &&
                                             e.call_id === `long_${k}`);
                if (client === 'run') {
                    assert.equal(r.code, 130, r.stderr);
                } else {
                    assert.equal(r.cancel.status, 200,
                                 JSON.stringify(r.cancel.body));
                    assert.equal(r.cancel.body.status, 'cancelled');
                }
                assert.equal(last(r.events).type, 'run.failed');
                assert.equal(last(r.events).status, 'cancelled');
                assert.ok(!completedCall(r.events, `long_${k}`));
                /* The server got notifications/cancelled for the request
                 * it was running. */
                await waitFor(() => spyLines(spyLogs[via]).length > before,
                              10000, `a cancel at ${via}: ${r.stderr}`);
                assert.match(spyLines(spyLogs[via])[before],
                             /^cancelled \d+ 1$/);
            });

            test(`${via} through loom ${client}: structured content and ` +
                 'resources', TIMEOUT, async () => {
                const { events } = await drive(stack, client, `results ${k}.`);
                assert.equal(last(events).type, 'run.completed',
                             JSON.stringify(last(events)));
                assert.deepEqual(ofType(events, 'tool.failed'), []);
                /* Its structuredContent fits the tool's outputSchema; the
                 * model reads the text content. */
                const st = completedCall(events, `st_${k}`);
                assert.deepEqual(JSON.parse(st.output), {
                    temperature: 36, conditions: 'Light rain / drizzle',
                    humidity: 82 });
                const links = completedCall(events, `links_${k}`).output;
                assert.match(links, /^Here are 2 resource links to resources available in this server:\n\n\[resource: demo:\/\/resource\/\S+ \(.+\)\]\n\n\[resource: demo:\/\/resource\/\S+ \(.+\)\]$/);
                const ref = completedCall(events, `ref_${k}`).output;
                assert.match(ref, /\[resource: demo:\/\/resource\/dynamic\/text\/1\]\nResource 1: This is a plaintext resource created at /);
            });
        }
    }

    for (const client of CLIENTS) {
        test(`server-filesystem through loom ${client}: list_directory and ` +
             'read_file', TIMEOUT, async () => {
            const { events } = await drive(stack, client, `files ${client}.`);
            assert.equal(last(events).type, 'run.completed',
                         JSON.stringify(last(events)));
            assert.equal(last(events).text, 'The notes say hello.');
            const ls = completedCall(events, `ls_${client}`).output;
            assert.deepEqual(ls.split('\n').sort(),
                             ['[DIR] sub', '[FILE] notes.txt']);
            const cat = completedCall(events, `cat_${client}`).output;
            assert.equal(cat, 'The notes say: hello from the filesystem.\n');
            assert.equal(toolMessage(stack, `cat_${client}`).content, cat);
        });
    }
});

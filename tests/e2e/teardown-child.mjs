#!/usr/bin/env node
/*
 * teardown-child.mjs: the processes teardown.test.mjs watches, in three
 * roles chosen by the first argument.
 *
 *   serve --config FILE ...  stands in for `loom serve` (LOOM_BIN points
 *       here): listens on 127.0.0.1, starts a process of its own that
 *       ignores SIGTERM (as an MCP server loom failed to stop would) and
 *       writes its pid to grandchild.pid beside FILE, says "listening
 *       127.0.0.1:PORT"; on SIGTERM it writes a sanitizer-like leak report
 *       and exits 1, as an ASan build with a leak does.
 *   close  a test file's process: Stack.start() on that stand-in, an
 *       http server of its own with a client's keep-alive connection
 *       open, prints {"loom": pid, "grandchild": pid} on stdout, then
 *       tears both down in one teardown() the way the browser tests'
 *       after() hooks do, and prints the error that teardown throws on
 *       stderr (exit status 1). It must then exit by itself.
 *   hold   the same stack, pids printed, then waits for ever: a test file
 *       stuck until the runner's timeout sends it SIGTERM.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';

const role = process.argv[2];

if (role === 'serve') {
    const config = process.argv[process.argv.indexOf('--config') + 1];
    const grandchild = spawn(process.execPath, ['-e',
        'process.on("SIGTERM", () => {}); setInterval(() => {}, 1000);'],
                             { stdio: 'ignore' });
    fs.writeFileSync(path.join(path.dirname(config), 'grandchild.pid'),
                     String(grandchild.pid));
    const server = http.createServer((req, res) => res.end('ok'));
    server.listen(0, '127.0.0.1', () => {
        process.stdout.write(
            `listening 127.0.0.1:${server.address().port}\n`);
    });
    process.on('SIGTERM', () => {
        process.stderr.write('==1==ERROR: LeakSanitizer: detected memory ' +
                             'leaks (stand-in)\n');
        process.exit(1);
    });
} else if (role === 'close' || role === 'hold') {
    const { Stack, closeServer, teardown } = await import('./harness.mjs');
    const stack = await Stack.start({});
    const grandchild = Number(fs.readFileSync(
        path.join(stack.dir, 'grandchild.pid'), 'utf8'));
    const web = http.createServer((req, res) => res.end('web'));
    await new Promise((r) => web.listen(0, '127.0.0.1', r));
    const agent = new http.Agent({ keepAlive: true });
    await new Promise((resolve, reject) => {
        http.get({ host: '127.0.0.1', port: web.address().port, agent },
                 (res) => res.resume().on('end', resolve)).on('error', reject);
    });
    process.stdout.write(JSON.stringify({ loom: stack.loom.child.pid,
                                          grandchild }) + '\n');
    if (role === 'hold') {
        setInterval(() => {}, 1000);
    } else {
        try {
            await teardown([() => stack.close(), () => closeServer(web)]);
        } catch (err) {
            process.stderr.write(`teardown failed: ${err.message}\n`);
            process.exitCode = 1;
        }
    }
} else {
    process.stderr.write(`teardown-child.mjs: unknown role ${role}\n`);
    process.exit(2);
}

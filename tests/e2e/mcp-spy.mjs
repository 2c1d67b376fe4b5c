/*
 * mcp-spy.mjs: loaded into the npm MCP servers the MCP end-to-end tests
 * start (`node --import ./mcp-spy.mjs <server> ...`), so a test can see
 * what the server saw and keep it on the loopback interface:
 *
 * - every notifications/cancelled the server's MCP SDK receives is
 *   appended to $MCP_SPY_LOG as a line "cancelled <requestId> <active>",
 *   active being 1 when a request of that id was still being handled
 *   (the cancel reached a running call) and 0 otherwise;
 * - a TCP server that listens on a port without a host (the servers call
 *   `app.listen(PORT)`) listens on 127.0.0.1 instead, and once it does
 *   the line "mcp-spy: listening 127.0.0.1:PORT" goes to stderr (stdout
 *   is the protocol's, in stdio mode), so PORT=0 picks a free port;
 * - with MCP_SPY_EXIT_ON_EOF set (an HTTP server, whose stdin the test
 *   holds), the server exits when its stdin closes, so it never outlives
 *   the test, and after MCP_SPY_MAX_SECONDS in any case.
 *
 * It patches the SDK's shared Protocol class, the one module instance the
 * server itself imports (both resolve to tests/e2e/node_modules).
 */
import fs from 'node:fs';
import net from 'node:net';
import { Protocol } from '@modelcontextprotocol/sdk/shared/protocol.js';

const log = process.env.MCP_SPY_LOG;

const oncancel = Protocol.prototype._oncancel;
Protocol.prototype._oncancel = function (notification) {
    const id = notification?.params?.requestId;
    const active = this._requestHandlerAbortControllers?.has(id) ? 1 : 0;
    if (log)
        fs.appendFileSync(log, `cancelled ${id} ${active}\n`);
    return oncancel.call(this, notification);
};

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
    const port = args[0];
    const isPort = typeof port === 'number' ||
        (typeof port === 'string' && /^\d+$/.test(port));
    if (isPort && typeof args[1] !== 'string')
        args.splice(1, 0, '127.0.0.1');
    this.once('listening', () => {
        const a = this.address();
        if (a && typeof a === 'object')
            process.stderr.write(`mcp-spy: listening ${a.address}:${a.port}\n`);
    });
    return listen.apply(this, args);
};

if (process.env.MCP_SPY_EXIT_ON_EOF) {
    process.stdin.on('end', () => process.exit(0));
    process.stdin.resume();
}
if (process.env.MCP_SPY_MAX_SECONDS)
    setTimeout(() => process.exit(0),
               Number(process.env.MCP_SPY_MAX_SECONDS) * 1000).unref();

/*
 * portkey-localhost.mjs: preloaded into the Portkey gateway's Node process
 * (node --import) by bench/serve.sh. It changes where the gateway listens,
 * nothing else.
 *
 * The gateway's entry point (build/start-server.js) calls @hono/node-server's
 * serve({port}) without a hostname, which listens on 0.0.0.0; the benchmark
 * must listen on 127.0.0.1 only. Node's net.Server.prototype.listen is
 * wrapped so that a listen on 0.0.0.0 (or with no host) becomes a listen on
 * 127.0.0.1. Once the server listens, "listening 127.0.0.1:PORT" is written
 * to the file named by $SERVEBENCH_PORT_FILE (the gateway is started with
 * --port=0, so the real port is only known here; its own banner prints the
 * port it was asked for).
 */
import fs from 'node:fs';
import net from 'node:net';

const portFile = process.env.SERVEBENCH_PORT_FILE;
const listen = net.Server.prototype.listen;

net.Server.prototype.listen = function (...args) {
    if (typeof args[0] === 'number' || typeof args[0] === 'string') {
        if (args.length < 2 || typeof args[1] === 'function')
            args.splice(1, 0, '127.0.0.1');
        else if (args[1] === '0.0.0.0' || args[1] === '::' || args[1] == null)
            args[1] = '127.0.0.1';
    } else if (args[0] && typeof args[0] === 'object' && !args[0].path) {
        args[0] = { ...args[0], host: '127.0.0.1' };
    }
    this.once('listening', () => {
        const a = this.address();
        if (portFile && a && typeof a === 'object')
            fs.writeFileSync(portFile, `listening ${a.address}:${a.port}\n`);
    });
    return listen.apply(this, args);
};

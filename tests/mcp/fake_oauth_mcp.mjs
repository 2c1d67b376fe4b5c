// An MCP server behind OAuth, with its own authorization server, for the
// tests of `loom mcp login` (tests/cli/test_mcp_login.sh). Node's http
// module only, no SDK. It listens on 127.0.0.1 at a free port and prints
// "port N" on stdout.
//
// /mcp speaks the 2025-11-25 Streamable HTTP transport with JSON answers
// (server/discover is "method not found"), and answers 401 with a
// WWW-Authenticate challenge to any request without a token it issued.
// Its one tool, whoami, says which client the token belongs to. The
// authorization server publishes RFC 8414 metadata (iss promised),
// registers clients (RFC 7591), and its /authorize redirects at once to
// the redirect URI with a code, the state and iss, as a browser whose
// person said yes would be sent. /token checks the code, the PKCE
// verifier (S256), the redirect URI and the resource, and takes the
// refresh tokens it gave (each used once: a refresh gives a new one).
// Tokens last $FAKE_OAUTH_EXPIRES_IN seconds (default 3600). Every
// request is appended to $FAKE_OAUTH_LOG (method, path, and the
// Authorization header's scheme only) when set, with "call CLIENT" for a
// tools/call and "refresh CLIENT" (or "refresh unknown") for a refresh.
import http from 'node:http';
import crypto from 'node:crypto';
import fs from 'node:fs';

let base = '';
const codes = new Map();
const tokens = new Map();
const refreshes = new Map();
const expiresIn = Number(process.env.FAKE_OAUTH_EXPIRES_IN || 3600);
let clients = 0;

const b64url = (buf) => buf.toString('base64url');
const note = (line) => {
    if (process.env.FAKE_OAUTH_LOG)
        fs.appendFileSync(process.env.FAKE_OAUTH_LOG, line + '\n');
};

function send(res, status, obj, headers = {}) {
    const body = obj === null ? '' : JSON.stringify(obj);
    res.writeHead(status, {'Content-Type': 'application/json', ...headers});
    res.end(body);
}

function rpc(req, res, msg) {
    const ok = (result, headers = {}) =>
        send(res, 200, {jsonrpc: '2.0', id: msg.id, result}, headers);
    if (msg.id === undefined)
        return send(res, 202, null);
    switch (msg.method) {
    case 'initialize':
        return ok({protocolVersion: '2025-11-25', capabilities: {tools: {}},
                   serverInfo: {name: 'fake-oauth', version: '1'}},
                  {'Mcp-Session-Id': 'session-1'});
    case 'tools/list':
        return ok({tools: [{name: 'whoami', description: 'who is calling',
                            inputSchema: {type: 'object'}}]});
    case 'tools/call': {
        const tok = (req.headers.authorization || '').slice(7);
        note(`call ${tokens.get(tok)}`);
        return ok({content: [{type: 'text',
                              text: 'hello ' + tokens.get(tok)}]});
    }
    default:
        return send(res, 200, {jsonrpc: '2.0', id: msg.id,
                               error: {code: -32601,
                                       message: 'method not found'}});
    }
}

const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => { body += c; });
    req.on('end', () => {
        const u = new URL(req.url, base);
        const auth = req.headers.authorization || '';
        note(`${req.method} ${u.pathname} ${auth.split(' ')[0] || '-'}`);
        if (u.pathname.startsWith('/.well-known/oauth-protected-resource'))
            return send(res, 200, {resource: base + '/mcp',
                                   authorization_servers: [base],
                                   scopes_supported: ['tools']});
        if (u.pathname === '/.well-known/oauth-authorization-server')
            return send(res, 200, {
                issuer: base,
                authorization_endpoint: base + '/authorize',
                token_endpoint: base + '/token',
                registration_endpoint: base + '/register',
                response_types_supported: ['code'],
                grant_types_supported: ['authorization_code',
                                        'refresh_token'],
                code_challenge_methods_supported: ['S256'],
                token_endpoint_auth_methods_supported: ['none'],
                authorization_response_iss_parameter_supported: true,
            });
        if (u.pathname === '/register' && req.method === 'POST') {
            const r = JSON.parse(body);
            return send(res, 201, {client_id: 'client-' + ++clients,
                                   redirect_uris: r.redirect_uris,
                                   token_endpoint_auth_method: 'none'});
        }
        if (u.pathname === '/authorize') {
            const q = u.searchParams;
            const redirect = q.get('redirect_uri');
            if (q.get('response_type') !== 'code' ||
                q.get('code_challenge_method') !== 'S256' || !redirect ||
                !redirect.startsWith('http://127.0.0.1:') ||
                q.get('resource') !== base + '/mcp')
                return send(res, 400, {error: 'invalid_request'});
            const code = b64url(crypto.randomBytes(16));
            codes.set(code, {challenge: q.get('code_challenge'), redirect,
                             client: q.get('client_id')});
            const to = new URL(redirect);
            to.searchParams.set('code', code);
            to.searchParams.set('state', q.get('state'));
            to.searchParams.set('iss', base);
            res.writeHead(302, {Location: to.toString()});
            return res.end();
        }
        if (u.pathname === '/token' && req.method === 'POST') {
            const f = new URLSearchParams(body);
            const issue = (client) => {
                const tok = 'tok-' + b64url(crypto.randomBytes(16));
                const ref = 'ref-' + b64url(crypto.randomBytes(16));
                tokens.set(tok, client);
                refreshes.set(ref, client);
                return send(res, 200, {access_token: tok,
                                       token_type: 'Bearer',
                                       expires_in: expiresIn, scope: 'tools',
                                       refresh_token: ref});
            };
            if (f.get('grant_type') === 'refresh_token') {
                const client = refreshes.get(f.get('refresh_token'));
                note(`refresh ${client || 'unknown'}`);
                if (!client || f.get('resource') !== base + '/mcp')
                    return send(res, 400, {error: 'invalid_grant'});
                refreshes.delete(f.get('refresh_token'));
                return issue(client);
            }
            const c = codes.get(f.get('code'));
            const verifier = f.get('code_verifier') || '';
            if (f.get('grant_type') !== 'authorization_code' || !c ||
                b64url(crypto.createHash('sha256').update(verifier)
                           .digest()) !== c.challenge ||
                f.get('redirect_uri') !== c.redirect ||
                f.get('resource') !== base + '/mcp')
                return send(res, 400, {error: 'invalid_grant'});
            codes.delete(f.get('code'));
            return issue(c.client);
        }
        if (u.pathname === '/mcp') {
            if (!auth.startsWith('Bearer ') || !tokens.has(auth.slice(7)))
                return send(res, 401, {error: 'unauthorized'}, {
                    'WWW-Authenticate':
                        `Bearer resource_metadata="${base}` +
                        '/.well-known/oauth-protected-resource/mcp"'});
            if (req.method !== 'POST')
                return send(res, 405, null);
            return rpc(req, res, JSON.parse(body));
        }
        return send(res, 404, {error: 'not found'});
    });
});

server.listen(0, '127.0.0.1', () => {
    base = `http://127.0.0.1:${server.address().port}`;
    process.stdout.write(`port ${server.address().port}\n`);
});

/*
 * The web UI's "MCP accounts" section in Chromium (docs/mcp.md
 * "Connecting your own account"): with keys, alice sees the MCP server
 * behind OAuth (tests/mcp/fake_oauth_mcp.mjs, whose authorization server
 * sends the browser straight back) as not connected; Connect opens the
 * authorization in a new tab, which lands on loom's callback page saying
 * connected; the section then says connected, and Disconnect undoes it.
 * Bob, another user, stays not connected throughout.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { Stack } from '../e2e/harness.mjs';
import { launch, openPage, shot } from './browser.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const FAKE_OAUTH = path.join(here, '..', 'mcp', 'fake_oauth_mcp.mjs');

/* Starts the fake OAuth MCP server: {proc, port}. */
function startOAuth() {
    const proc = spawn(process.execPath, [FAKE_OAUTH],
                       { stdio: ['ignore', 'pipe', 'inherit'] });
    return new Promise((resolve, reject) => {
        let out = '';
        proc.on('error', reject);
        proc.on('exit', (code) => reject(new Error(`fake exited ${code}`)));
        proc.stdout.on('data', (d) => {
            out += d;
            const m = /port (\d+)/.exec(out);
            if (m)
                resolve({ proc, port: Number(m[1]) });
        });
    });
}

async function mine(stack, key) {
    const res = await fetch(`${stack.baseURL}/v1/me/mcp`,
                            { headers: { Authorization: `Bearer ${key}` } });
    assert.equal(res.status, 200);
    return (await res.json()).data;
}

describe('MCP accounts in the web UI', () => {
    let oauth;
    let stack;
    let browser;
    let alice;
    let bob;

    before(async () => {
        oauth = await startOAuth();
        stack = await Stack.start({
            fakes: { fake: { responses: [{ text: ['hi'] }] } },
            auth: { mode: 'keys' },
            mcp: { web: { url: `http://127.0.0.1:${oauth.port}/mcp` } },
        });
        browser = await launch();
        const newKey = (user) => {
            const out = stack.keys('create', '--user', user).trim()
                .split('\n');
            return out[out.length - 1];
        };
        alice = newKey('alice');
        bob = newKey('bob');
    });

    after(async () => {
        try {
            if (browser)
                await browser.close();
            if (stack)
                await stack.close();
        } finally {
            if (oauth) {
                oauth.proc.removeAllListeners('exit');
                oauth.proc.kill();
            }
        }
    });

    test('connect, see connected, disconnect', async () => {
        const { page, context, seen } = await openPage(browser, stack,
                                                       { key: alice });
        const section = page.locator('#accounts');
        await section.waitFor();
        await section.locator('summary').click();
        const row = section.locator('li[data-server="web"]');
        await row.getByText('Not connected').waitFor();
        await shot(page, 'mcp-accounts');

        const [tab] = await Promise.all([
            context.waitForEvent('page'),
            row.getByRole('button', { name: 'Connect web' }).click(),
        ]);
        await tab.getByText(/account for the MCP server 'web' is connected/)
            .waitFor();
        assert.equal(new URL(tab.url()).pathname, '/v1/mcp/oauth/callback');
        assert.deepEqual((await mine(stack, alice)).map((s) => s.connected),
                         [true]);
        assert.deepEqual((await mine(stack, bob)).map((s) => s.connected),
                         [false]);
        await tab.close();

        /* The section reads the list again when the page has the focus
         * back, or on reload. */
        await page.reload();
        await section.locator('summary').click();
        await row.getByText('Connected', { exact: true }).waitFor();
        await row.getByRole('button', { name: 'Disconnect web' }).click();
        await row.getByText('Not connected').waitFor();
        assert.deepEqual((await mine(stack, alice)).map((s) => s.connected),
                         [false]);
        assert.deepEqual(seen, { dialogs: [], errors: [], csp: [] });
        await context.close();
    });
});

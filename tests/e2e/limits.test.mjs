/*
 * Limits and budgets (docs/accounts.md "Limits", "Budgets") through the
 * official openai SDK against `loom serve` in auth mode keys, keys made
 * by `loom keys create`:
 *
 * - the x-ratelimit-* headers on every answer, as OpenAI sends them;
 * - 200 requests at once against a budget that pays for exactly 10
 *   calls: 10 succeed, 190 are 429 insufficient_quota, and the stored
 *   spend is the budget, never more; the audit log says it was used up;
 * - the same 200 against 10 requests per minute: 10 succeed, 190 are 429
 *   rate_limit_exceeded with Retry-After;
 * - the same 200 against 5 concurrent runs whose model never answers:
 *   exactly 195 are refused (the test would wait forever for a 196th);
 * - a model without prices under a budget, and a workspace's limit set
 *   through the admin API.
 *
 * The model costs $1 per million output tokens and nothing for input,
 * and the fake reports exactly max_tokens output tokens: each call's real
 * cost is its reserved worst case, 100 micro-dollars.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Stack } from './harness.mjs';

const TIMEOUT = { timeout: 120000 };
const ADMIN = 'e2e-admin-key-0123456789';
const N = 200;
const MAX_TOKENS = 100;

/* Text whose usage reports MAX_TOKENS output tokens. */
const paid = {
    text: ['Paid.'],
    usage: { prompt_tokens: 10, completion_tokens: MAX_TOKENS,
             total_tokens: 10 + MAX_TOKENS },
};

function newKey(stack, ...args) {
    const out = stack.keys('create', ...args).trim().split('\n');
    return out[out.length - 1];
}

/* One chat request; {ok, status, code, headers}. */
async function ask(client, model = 'fake/priced', signal = undefined) {
    try {
        const raw = await client.chat.completions.create({
            model, max_tokens: MAX_TOKENS,
            messages: [{ role: 'user', content: 'Hi' }],
        }, { signal }).withResponse();
        return { ok: true, status: 200, headers: raw.response.headers,
                 text: raw.data.choices[0].message.content };
    } catch (err) {
        if (err.status === undefined)
            throw err;
        return { ok: false, status: err.status, code: err.code,
                 type: err.type, headers: err.headers };
    }
}

async function admin(stack, method, p, body) {
    const res = await fetch(`${stack.baseURL}${p}`, {
        method,
        headers: { Authorization: `Bearer ${ADMIN}`,
                   'Content-Type': 'application/json' },
        body: body ? JSON.stringify(body) : undefined,
    });
    return { status: res.status, body: await res.json() };
}

describe('limits and budgets', () => {
    let stack;

    before(async () => {
        stack = await Stack.start({
            fakes: {
                fake: { loop: true, responses: [paid] },
                slow: { loop: true, responses: [{ hang: true }] },
            },
            models: {
                'fake/priced': { prices: { input: 0, output: 1 } },
                'slow/priced': { prices: { input: 0, output: 1 } },
            },
            server: { max_concurrent_runs: 256, max_connections: 1024 },
            auth: { mode: 'keys', admin_key: ADMIN },
        });
    }, { timeout: 30000 });

    after(async () => {
        if (stack)
            await stack.close();
    }, { timeout: 60000 });

    test('x-ratelimit headers on every answer', TIMEOUT, async () => {
        const key = newKey(stack, '--user', 'hdr', '--rpm', '100',
                           '--tpm', '100000');
        const r = await ask(stack.client({ apiKey: key }));
        assert.ok(r.ok, JSON.stringify(r));
        assert.equal(r.headers.get('x-ratelimit-limit-requests'), '100');
        assert.equal(r.headers.get('x-ratelimit-remaining-requests'), '99');
        assert.match(r.headers.get('x-ratelimit-reset-requests'),
                     /^(\d+ms|[\d.]+s|\d+m\d+s)$/);
        assert.equal(r.headers.get('x-ratelimit-limit-tokens'), '100000');
        assert.ok(r.headers.get('x-ratelimit-remaining-tokens'));
        assert.ok(r.headers.get('x-ratelimit-reset-tokens'));
        /* The tokens of that call count against the next answer. */
        const r2 = await ask(stack.client({ apiKey: key }));
        assert.equal(r2.headers.get('x-ratelimit-remaining-requests'), '98');
        assert.equal(r2.headers.get('x-ratelimit-remaining-tokens'),
                     String(100000 - (10 + MAX_TOKENS)));
    });

    test('200 at once against a budget of 10 calls', TIMEOUT, async () => {
        const key = newKey(stack, '--user', 'budget', '--workspace', 'b',
                           '--budget-usd', '0.001', '--budget-period',
                           'month');
        const id = key.slice(3, 19);
        const client = stack.client({ apiKey: key, timeout: 100000 });
        const sent = stack.fakeRequests('fake').length;
        const results = await Promise.all(
            Array.from({ length: N }, () => ask(client)));
        /* Refused calls never went upstream. */
        assert.equal(stack.fakeRequests('fake').length - sent, 10);
        const ok = results.filter((r) => r.ok);
        const refused = results.filter((r) => !r.ok);
        assert.equal(ok.length, 10);
        for (const r of refused) {
            assert.equal(r.status, 429, JSON.stringify(r));
            assert.equal(r.code, 'insufficient_quota');
        }
        const spend = await admin(stack, 'GET',
                                  `/v1/admin/spend?scope=key:${id}`);
        assert.equal(spend.status, 200);
        assert.equal(spend.body.data.length, 1);
        assert.equal(spend.body.data[0].spent_micros, 1000);
        assert.equal(spend.body.data[0].period, 'month');
        /* Still used up: refused before any run starts. */
        const again = await ask(client);
        assert.equal(again.code, 'insufficient_quota');
        const audit = await admin(stack, 'GET', '/v1/admin/audit');
        const used = audit.body.data.filter(
            (e) => e.action === 'budget.exhausted' && e.key_id === id);
        assert.equal(used.length, 1);
        assert.equal(used[0].detail.budget_micros, 1000);
    });

    test('200 at once against 10 requests per minute', TIMEOUT, async () => {
        const key = newKey(stack, '--user', 'rpm', '--rpm', '10');
        const client = stack.client({ apiKey: key, timeout: 100000 });
        const results = await Promise.all(
            Array.from({ length: N }, () => ask(client)));
        assert.equal(results.filter((r) => r.ok).length, 10);
        for (const r of results.filter((x) => !x.ok)) {
            assert.equal(r.status, 429);
            assert.equal(r.code, 'rate_limit_exceeded');
            assert.equal(r.type, 'requests');
            assert.ok(Number(r.headers.get('retry-after')) >= 1);
            assert.equal(r.headers.get('x-ratelimit-remaining-requests'), '0');
        }
    });

    test('200 at once against 5 concurrent runs', TIMEOUT, async () => {
        const key = newKey(stack, '--user', 'conc', '--max-concurrent', '5');
        const client = stack.client({ apiKey: key, timeout: 100000 });
        const aborts = [];
        let settled = 0;
        let wake;
        const refusedAll = new Promise((resolve) => { wake = resolve; });
        const runs = Array.from({ length: N }, () => {
            const ac = new AbortController();
            aborts.push(ac);
            return ask(client, 'slow/priced', ac.signal).then((r) => {
                if (++settled === N - 5)
                    wake();
                return r;
            }, (err) => ({ aborted: true, err }));
        });
        /* Five runs hang upstream; every other request is refused. */
        await refusedAll;
        for (const ac of aborts)
            ac.abort();
        const results = await Promise.all(runs);
        const refused = results.filter((r) => !r.aborted);
        assert.equal(refused.length, N - 5);
        for (const r of refused) {
            assert.equal(r.status, 429, JSON.stringify(r));
            assert.equal(r.code, 'rate_limit_exceeded');
        }
    });

    test('a model without prices under a budget', TIMEOUT, async () => {
        const strict = newKey(stack, '--user', 'u1', '--budget-usd', '1');
        const loose = newKey(stack, '--user', 'u2', '--budget-usd', '1',
                             '--budget-allow-unpriced');
        const r = await ask(stack.client({ apiKey: strict }),
                            'fake/unpriced');
        assert.equal(r.status, 403);
        assert.equal(r.code, 'model_not_priced');
        const r2 = await ask(stack.client({ apiKey: loose }), 'fake/unpriced');
        assert.ok(r2.ok, JSON.stringify(r2));
    });

    test("a workspace's limit counts every key in it", TIMEOUT, async () => {
        const k1 = newKey(stack, '--user', 'w1', '--workspace', 'ws');
        const k2 = newKey(stack, '--user', 'w2', '--workspace', 'ws');
        const set = await admin(stack, 'PATCH', '/v1/admin/workspaces/ws',
                                { rpm: 2 });
        assert.equal(set.status, 200);
        assert.equal(set.body.limits.rpm, 2);
        assert.ok((await ask(stack.client({ apiKey: k1 }))).ok);
        assert.ok((await ask(stack.client({ apiKey: k2 }))).ok);
        const r = await ask(stack.client({ apiKey: k1 }));
        assert.equal(r.status, 429);
        assert.equal(r.code, 'rate_limit_exceeded');
        const audit = await admin(stack, 'GET', '/v1/admin/audit');
        assert.ok(audit.body.data.some(
            (e) => e.action === 'workspace.limits_changed' &&
                   e.workspace === 'ws'));
    });
});

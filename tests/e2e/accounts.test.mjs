/*
 * The official openai npm package against `loom serve` in auth mode keys
 * (docs/accounts.md): keys made by `loom keys create` on the running
 * server's database are the SDK's apiKey; a wrong or revoked key is the
 * SDK's AuthenticationError (401 invalid_api_key); a key limited to one
 * agent gets PermissionDeniedError (403 agent_not_allowed) for another;
 * one user's conversation is a 404 for another, and a request naming
 * "alice" with Bob's key does not reach Alice's memories. Neither key
 * ever shows in loom's log.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { Stack, textResponse } from './harness.mjs';

const TIMEOUT = { timeout: 30000 };

const storeCall = {
    tool_calls: [{ id: 'c1', name: 'memory_store',
                   arguments: '{"content":"The PIN is 4321."}' }] };
const retrieveCall = {
    tool_calls: [{ id: 'c2', name: 'memory_retrieve',
                   arguments: '{"query":"PIN"}' }] };

/* The last line of `loom keys create`: the key. */
function newKey(stack, ...args) {
    const out = stack.keys('create', ...args).trim().split('\n');
    return out[out.length - 1];
}

describe('accounts with the openai SDK', () => {
    let stack;
    let alice;
    let bob;

    before(async () => {
        stack = await Stack.start({
            fakes: {
                fake: { responses: [
                    textResponse(['Hello Alice.']),
                    storeCall, textResponse(['Noted.']),
                    retrieveCall, textResponse(['I do not know.']),
                    textResponse(['Plain.']),
                ] },
            },
            agents: {
                helper: { model: 'fake/fake-model' },
                plain: { model: 'fake/fake-model', tools: [], memory: false },
            },
            auth: { mode: 'keys' },
        });
        alice = newKey(stack, '--user', 'alice', '--workspace', 'acme');
        bob = newKey(stack, '--user', 'bob', '--workspace', 'acme',
                     '--agents', 'helper');
        assert.match(alice, /^lk_[0-9a-f]{16}_[0-9a-f]{48}$/);
    });

    after(async () => {
        const log = stack.loomLog();
        await stack.close();
        for (const k of [alice, bob])
            assert.ok(!log.includes(k.slice(20)), 'a key is in the log');
    });

    test('keys, isolation and memories', TIMEOUT, async () => {
        const a = stack.client({ apiKey: alice });
        const b = stack.client({ apiKey: bob });
        const raw = await a.chat.completions.create({
            model: 'agent/helper', user: 'alice',
            messages: [{ role: 'user', content: 'Hi' }],
        }).withResponse();
        assert.equal(raw.data.choices[0].message.content, 'Hello Alice.');
        const conv = raw.response.headers.get('x-loom-conversation-id');
        assert.ok(conv);

        /* Alice's conversation is not there for Bob. */
        const other = await fetch(`${stack.baseURL}/v1/conversations/${conv}`,
                                  { headers: { Authorization: `Bearer ${bob}` } });
        assert.equal(other.status, 404);
        const mine = await fetch(`${stack.baseURL}/v1/conversations/${conv}`,
                                 { headers: { Authorization: `Bearer ${alice}` } });
        assert.equal(mine.status, 200);

        /* Alice stores a PIN; Bob, naming alice, does not find it. */
        await a.chat.completions.create({
            model: 'agent/helper', user: 'alice',
            messages: [{ role: 'user', content: 'My PIN is 4321.' }],
        });
        await b.chat.completions.create({
            model: 'agent/helper', user: 'alice',
            messages: [{ role: 'user', content: 'What is my PIN?' }],
        });
        const reqs = stack.fakeRequests('fake');
        const tool = reqs[4].body.messages.find((m) => m.role === 'tool');
        assert.ok(tool, 'the retrieve call has a result');
        assert.ok(!tool.content.includes('4321'), tool.content);

        /* Bob's key is limited to the agent helper. */
        await assert.rejects(
            b.chat.completions.create({
                model: 'agent/plain',
                messages: [{ role: 'user', content: 'Hi' }] }),
            (err) => err instanceof OpenAI.PermissionDeniedError &&
                err.status === 403 && err.code === 'agent_not_allowed');
    });

    test('wrong and revoked keys', TIMEOUT, async () => {
        const wrong = alice.slice(0, -1) + (alice.endsWith('0') ? '1' : '0');
        await assert.rejects(
            stack.client({ apiKey: wrong }).models.list(),
            (err) => err instanceof OpenAI.AuthenticationError &&
                err.code === 'invalid_api_key' && !err.message.includes(wrong));
        stack.keys('revoke', alice);
        await assert.rejects(
            stack.client({ apiKey: alice }).models.list(),
            (err) => err instanceof OpenAI.AuthenticationError);
        const list = await stack.client({ apiKey: bob }).models.list();
        assert.ok(list.data.length > 0);
    });
});

/*
 * Concurrency: 200 streamed runs started at once through the openai SDK
 * against one `loom serve`. Every one must complete with the whole answer
 * at the client, and every turn must be stored intact in its own
 * conversation: the right user message, the whole answer, no message of
 * another run.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Stack, mapLimit, textResponse } from './harness.mjs';

const RUNS = 200;
const PIECES = ['The ', 'quick ', 'brown ', 'fox ', 'jumps.'];
const ANSWER = PIECES.join('');

describe('200 simultaneous streaming runs', () => {
    let stack;

    before(async () => {
        stack = await Stack.start({
            fakes: {
                fake: { loop: true, responses: [
                    textResponse(PIECES, { chunk_delay_ms: 10 })] },
            },
            server: { max_concurrent_runs: 256, max_connections: 1024 },
        });
    }, { timeout: 30000 });

    after(async () => {
        if (stack)
            await stack.close();
    }, { timeout: 60000 });

    test('all complete and all are stored intact', { timeout: 90000 },
         async () => {
        const client = stack.client({ timeout: 80000 });
        const prompts = Array.from({ length: RUNS },
                                   (_, i) => `concurrent run ${i}`);

        const results = await Promise.all(prompts.map(async (prompt) => {
            const stream = await client.chat.completions.create({
                model: 'fake/fake-model',
                stream: true,
                messages: [{ role: 'user', content: prompt }],
            });
            let content = '';
            let finish = null;
            let conversationId = null;
            for await (const chunk of stream) {
                conversationId ??= chunk.conversation_id;
                const c = chunk.choices[0];
                if (c?.delta?.content)
                    content += c.delta.content;
                if (c?.finish_reason)
                    finish = c.finish_reason;
            }
            return { prompt, content, finish, conversationId };
        }));

        for (const r of results) {
            assert.equal(r.content, ANSWER, r.prompt);
            assert.equal(r.finish, 'stop', r.prompt);
            assert.match(r.conversationId ?? '', /^conv_[0-9a-f]{24}$/,
                         r.prompt);
        }
        const ids = new Set(results.map((r) => r.conversationId));
        assert.equal(ids.size, RUNS, 'one conversation per run');

        /* Upstream saw each prompt exactly once. */
        const sent = stack.fakeRequests('fake').map(
            (q) => q.body.messages.at(-1).content).sort();
        assert.deepEqual(sent, [...prompts].sort());

        /* [DONE] comes after the turn is stored: every one is there. */
        await mapLimit(results, 16, async (r) => {
            const conv = await stack.get(
                `/v1/conversations/${r.conversationId}`);
            assert.equal(conv.status, 200, r.prompt);
            const m = conv.body.messages;
            assert.equal(m.length, 2, `${r.prompt}: ${JSON.stringify(m)}`);
            assert.equal(m[0].role, 'user');
            assert.equal(m[0].content, r.prompt);
            assert.equal(m[1].role, 'assistant');
            assert.equal(m[1].content, ANSWER);
            assert.equal(m[1].status, 'ok');
            assert.equal(m[1].finish_reason, 'stop');
            assert.equal(conv.body.usage.length, 1, r.prompt);
            assert.equal(conv.body.usage[0].total_tokens,
                         10 + PIECES.length);
        });

        const list = await stack.get('/v1/conversations?limit=100');
        assert.equal(list.status, 200);
        assert.equal(list.body.data.length, 100);
        assert.equal(list.body.has_more, true);
    });
});

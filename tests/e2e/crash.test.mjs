/*
 * Crash safety: 50 streamed runs, of three kinds by the fake's answer
 * (quick ones; slow ones whose chunks come 60 ms apart; ones that send
 * two chunks and then hang), so that when the quick ones have all ended
 * the rest are in flight. Then kill -9 of `loom serve`, and a restart on
 * the same database: it must open cleanly and answer /readyz, every run
 * whose client received `data: [DONE]` (sent only once the turn is
 * stored) must be there with the answer the client saw, the other
 * conversations must read without error, and the restarted server must be
 * able to continue a conversation.
 *
 * The streams are read with plain fetch, not the SDK, to tell exactly
 * whether [DONE] arrived: the SDK ends its iteration quietly on a stream
 * that just stops.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Stack, mapLimit, textResponse } from './harness.mjs';

const RUNS = 50;
const QUICK = ['Quick ', 'answer.'];
const SLOW = Array.from({ length: 40 }, (_, i) => `slow${i} `);
const HUNG = ['Hung ', 'answer '];
/* Requests to the fake take these answers in turn. */
const SCRIPT = {
    loop: true,
    responses: [
        textResponse(QUICK),
        textResponse(SLOW, { chunk_delay_ms: 60 }),
        textResponse(HUNG, { hang: true, hang_after_chunks: 3 }),
    ],
};
const QUICK_RUNS = Math.ceil(RUNS / 3);
const WAIT_MS = 30000;

/* One run read with fetch: resolves when its stream ends or breaks. */
function startRun(stack, i, state) {
    const run = { prompt: `crash run ${i}`, text: '', done: false,
                  started: false, conversationId: null, error: null };
    run.finished = (async () => {
        try {
            const res = await fetch(`${stack.baseURL}/v1/chat/completions`, {
                method: 'POST',
                headers: { 'content-type': 'application/json' },
                body: JSON.stringify({
                    model: 'crash/fake-model', stream: true,
                    messages: [{ role: 'user', content: run.prompt }],
                }),
                signal: AbortSignal.timeout(60000),
            });
            assert.equal(res.status, 200);
            run.conversationId = res.headers.get('x-loom-conversation-id');
            run.started = true;
            state.changed();
            const decoder = new TextDecoder();
            let buf = '';
            for await (const bytes of res.body) {
                buf += decoder.decode(bytes, { stream: true });
                let cut;
                while ((cut = buf.indexOf('\n\n')) >= 0) {
                    const event = buf.slice(0, cut);
                    buf = buf.slice(cut + 2);
                    if (!event.startsWith('data: '))
                        continue;
                    const data = event.slice(6);
                    if (data === '[DONE]') {
                        run.done = true;
                        state.changed();
                        continue;
                    }
                    const delta = JSON.parse(data).choices?.[0]?.delta;
                    if (delta?.content)
                        run.text += delta.content;
                }
            }
        } catch (err) {
            run.error = err;
            state.changed();
        }
    })();
    return run;
}

/* Resolves once pred() holds, rejects when a run failed; checked
 * whenever a run changes. */
function waitFor(state, runs, pred, what) {
    return new Promise((resolve, reject) => {
        const timer = setTimeout(
            () => reject(new Error(`timed out waiting for ${what}`)),
            WAIT_MS);
        state.changed = () => {
            const bad = runs.find((r) => r.error);
            if (bad) {
                clearTimeout(timer);
                state.changed = () => {};
                reject(new Error(`${bad.prompt} failed before the kill: ` +
                                 `${bad.error}`));
            } else if (pred()) {
                clearTimeout(timer);
                state.changed = () => {};
                resolve();
            }
        };
        state.changed();
    });
}

describe('kill -9 of the server during 50 runs', () => {
    let stack;

    before(async () => {
        stack = await Stack.start({
            fakes: {
                crash: SCRIPT,
                after: { loop: true, responses: [
                    textResponse(['After ', 'restart.'])] },
            },
        });
    }, { timeout: 30000 });

    after(async () => {
        if (stack)
            await stack.close();
    }, { timeout: 60000 });

    test('restart opens the database; every completed run is there',
         { timeout: 90000 }, async (t) => {
        const state = { changed: () => {} };
        const runs = [];
        for (let i = 0; i < RUNS; i++)
            runs.push(startRun(stack, i, state));
        const doneCount = () => runs.filter((r) => r.done).length;

        /* Every run under way, and every quick one ended. */
        await waitFor(state, runs, () => runs.every((r) => r.started) &&
                      doneCount() >= QUICK_RUNS,
                      `${QUICK_RUNS} runs to end`);
        const inFlight = runs.filter((r) => !r.done).length;
        assert.ok(inFlight > 0, 'some runs are still in flight');

        await stack.killLoom();
        await Promise.all(runs.map((r) => r.finished));
        const completed = runs.filter((r) => r.done);
        assert.ok(completed.length >= QUICK_RUNS);
        t.diagnostic(`${completed.length} runs had ended, ` +
                     `${RUNS - completed.length} were cut by the kill`);
        for (const r of completed) {
            assert.equal(r.error, null, `${r.prompt}: ${r.error}`);
            assert.ok(r.text === QUICK.join('') || r.text === SLOW.join(''),
                      `${r.prompt}: ${r.text}`);
        }

        await stack.startLoom();
        const ready = await stack.get('/readyz');
        assert.equal(ready.status, 200, JSON.stringify(ready.body));
        assert.equal(ready.body.status, 'ready');

        await mapLimit(completed, 8, async (r) => {
            const conv = await stack.get(
                `/v1/conversations/${r.conversationId}`);
            assert.equal(conv.status, 200, r.prompt);
            const m = conv.body.messages;
            assert.equal(m.length, 2, `${r.prompt}: ${JSON.stringify(m)}`);
            assert.equal(m[0].role, 'user');
            assert.equal(m[0].content, r.prompt);
            assert.equal(m[1].role, 'assistant');
            assert.equal(m[1].content, r.text);
            assert.equal(m[1].status, 'ok');
        });

        /* The runs cut by the kill: their conversations read cleanly
         * (whatever was stored of them, if anything). */
        const cut = [];
        await mapLimit(runs.filter((r) => !r.done && r.conversationId), 8,
                       async (r) => {
            const conv = await stack.get(
                `/v1/conversations/${r.conversationId}`);
            assert.ok(conv.status === 200 || conv.status === 404,
                      `${r.prompt}: ${conv.status} ` +
                      JSON.stringify(conv.body));
            cut.push(conv.status === 200
                ? conv.body.messages.map((m) => m.role).join('+') || 'empty'
                : conv.status);
            if (conv.status === 200) {
                assert.ok(Array.isArray(conv.body.messages));
                assert.ok(conv.body.messages.every(
                    (m) => m.role !== 'user' || m.content === r.prompt));
            }
        });

        const seen = {};
        for (const c of cut)
            seen[c] = (seen[c] ?? 0) + 1;
        t.diagnostic(`cut runs' conversations: ${JSON.stringify(seen)}`);

        const list = await stack.get('/v1/conversations?limit=100');
        assert.equal(list.status, 200);
        const listed = new Set(list.body.data.map((c) => c.id));
        for (const r of completed)
            assert.ok(listed.has(r.conversationId), r.prompt);

        /* The restarted server writes too: continue a completed run. */
        const client = stack.client();
        const next = await client.chat.completions.create({
            model: 'after/fake-model',
            conversation_id: completed[0].conversationId,
            messages: [{ role: 'user', content: 'And now?' }],
        });
        assert.equal(next.choices[0].message.content, 'After restart.');
        const sent = stack.fakeRequests('after')[0].body.messages;
        assert.deepEqual(sent.map((m) => [m.role, m.content]),
                         [['user', completed[0].prompt],
                          ['assistant', completed[0].text],
                          ['user', 'And now?']]);
    });
});

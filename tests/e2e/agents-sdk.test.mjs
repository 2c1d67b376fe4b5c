/*
 * The OpenAI Agents JS SDK (@openai/agents, Chat Completions model, tracing
 * off) against `loom serve`: an SDK agent whose model is one of loom's
 * agents (`agent/<name>`, which offers loom's get_time) and which has a
 * function tool of its own, defined with zod. loom runs get_time within a
 * request, the SDK runs its own tool between requests, and the final answer
 * is the model's; the fake provider's records show both tools offered and
 * each tool's result sent back to the model. Streamed and not, each with
 * its own fake provider.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
    Agent,
    OpenAIChatCompletionsModel,
    Runner,
    setTracingDisabled,
    tool,
} from '@openai/agents';
import { z } from 'zod';
import { Stack, textResponse } from './harness.mjs';

setTracingDisabled(true);

const TIMEOUT = { timeout: 30000 };

/*
 * Per SDK run: the model calls loom's get_time (loom answers it and asks
 * again within the same request), then the SDK's get_weather (handed back
 * to the SDK, which runs it and sends a second request), then answers.
 */
const ROUNDS = [
    { tool_calls: [{ id: 'call_time', name: 'get_time',
                     arguments: '{"timezone":"Asia/Tokyo"}' }] },
    { tool_calls: [{ id: 'call_weather', name: 'get_weather',
                     arguments: ['{"city":', '"Tokyo"}'] }] },
    textResponse(['Tokyo: 21C', ' and late.']),
];

const fakes = {
    sdk: { loop: true, responses: ROUNDS },
    sdkstream: { loop: true, responses: ROUNDS },
};

const agents = {
    clock: { model: 'sdk/fake-model', tools: ['get_time'],
             system_prompt: 'You tell the time.' },
    clockstream: { model: 'sdkstream/fake-model', tools: ['get_time'],
                   system_prompt: 'You tell the time.' },
};

/* The SDK's own tool; asked notes each city it was run for. */
function weatherTool(asked) {
    return tool({
        name: 'get_weather',
        description: 'The weather in a city.',
        parameters: z.object({ city: z.string() }),
        execute: async ({ city }) => {
            asked.push(city);
            return JSON.stringify({ city, temp_c: 21 });
        },
    });
}

describe('OpenAI Agents SDK against loom serve', () => {
    let stack;

    before(async () => {
        stack = await Stack.start({ fakes, agents });
    }, { timeout: 30000 });

    after(async () => {
        if (stack)
            await stack.close();
    }, { timeout: 60000 });

    for (const stream of [false, true]) {
        const fake = stream ? 'sdkstream' : 'sdk';
        const loomAgent = stream ? 'clockstream' : 'clock';
        test(`an agent model with the SDK's own tool (${stream ? 'streamed'
             : 'not streamed'})`, TIMEOUT, async () => {
            const asked = [];
            const agent = new Agent({
                name: 'assistant',
                instructions: 'Answer with the time and the weather.',
                model: new OpenAIChatCompletionsModel(
                    stack.client(), `agent/${loomAgent}`),
                tools: [weatherTool(asked)],
            });
            const runner = new Runner({ tracingDisabled: true });
            const result = await runner.run(
                agent, 'Time and weather in Tokyo?', { stream, maxTurns: 5 });
            if (stream) {
                for await (const ev of result)
                    assert.ok(ev.type);
                await result.completed;
            }

            assert.equal(result.finalOutput, 'Tokyo: 21C and late.');
            /* The SDK ran its own tool, once; never loom's. */
            assert.deepEqual(asked, ['Tokyo']);
            const calls = result.newItems
                .filter((i) => i.type === 'tool_call_item')
                .map((i) => i.rawItem.name);
            assert.deepEqual(calls, ['get_weather']);
            /* Two requests from the SDK. */
            assert.equal(result.rawResponses.length, 2);

            /* Three model calls: loom answered get_time within the
             * first request. */
            const reqs = stack.fakeRequests(fake);
            assert.equal(reqs.length, 3);
            for (const r of reqs) {
                assert.equal(r.body.model, 'fake-model');
                /* Streamed from the model only when the SDK streams. */
                assert.equal(r.body.stream, stream ? true : undefined);
                const offered = r.body.tools.map((t) => t.function.name);
                assert.deepEqual(offered.sort(), ['get_time', 'get_weather']);
                const system = r.body.messages
                    .filter((m) => m.role === 'system')
                    .map((m) => m.content).join('\n');
                assert.match(system, /You tell the time\./);
                assert.match(system, /Answer with the time and the weather\./);
            }
            const weatherSpec = reqs[0].body.tools
                .find((t) => t.function.name === 'get_weather').function;
            assert.deepEqual(weatherSpec.parameters.required, ['city']);

            /* loom's tool result went back to the model in its second
             * call, the SDK's in its third. */
            const toolMsg = (r, id) => r.body.messages.find(
                (m) => m.role === 'tool' && m.tool_call_id === id);
            const time = JSON.parse(toolMsg(reqs[1], 'call_time').content);
            assert.equal(time.timezone, 'Asia/Tokyo');
            assert.equal(time.utc_offset, '+09:00');
            assert.equal(toolMsg(reqs[1], 'call_weather'), undefined);
            assert.deepEqual(
                JSON.parse(toolMsg(reqs[2], 'call_weather').content),
                { city: 'Tokyo', temp_c: 21 });
            /* The SDK resends only its own history; loom recognises it
             * as the stored conversation's continuation, so the model
             * still sees loom's get_time call and result. */
            assert.notEqual(toolMsg(reqs[2], 'call_time'), undefined);
            const asking = reqs[2].body.messages.find(
                (m) => m.role === 'assistant' &&
                    m.tool_calls?.some((c) => c.id === 'call_weather'));
            assert.equal(asking.tool_calls[0].function.arguments,
                         '{"city":"Tokyo"}');
        });
    }
});

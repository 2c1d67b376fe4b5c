/*
 * The official openai npm package against `loom serve`: plain answers,
 * streaming through the SDK's own accumulating helpers, loom's tools given
 * by name, client tools and their follow-up request, runTools() mixing
 * loom's tools and the client's, a stop (abort or cancel) ending a stream,
 * structured output parsed by the SDK against a zod schema, an image
 * part, the agents in the model list, and errors surfacing as the SDK's
 * exception classes. Each test has its
 * own fake provider, so a failure in one cannot shift another's scripted
 * answers.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { ChatCompletionStream } from 'openai/lib/ChatCompletionStream';
import { z } from 'zod';
import { API_KEY, Stack, textResponse } from './harness.mjs';

const TIMEOUT = { timeout: 30000 };

const WEATHER_TOOL = {
    type: 'function',
    function: {
        name: 'get_weather',
        description: 'The weather in a city.',
        parameters: {
            type: 'object',
            properties: { city: { type: 'string' } },
            required: ['city'],
        },
    },
};

/*
 * Three rounds of runTools(): loom's get_time then the client's
 * get_weather (Paris); both in one turn (Berlin); the answer. Each round
 * is one request from the SDK; loom answers its own calls within it.
 */
const MIXED_ROUNDS = [
    { tool_calls: [{ id: 'call_t1', name: 'get_time',
                     arguments: '{"timezone":"Europe/Paris"}' }] },
    { tool_calls: [{ id: 'call_w1', name: 'get_weather',
                     arguments: '{"city":"Paris"}' }] },
    { tool_calls: [{ id: 'call_t2', name: 'get_time',
                     arguments: '{"timezone":"Europe/Berlin"}' },
                   { id: 'call_w2', name: 'get_weather',
                     arguments: '{"city":"Berlin"}' }] },
    textResponse(['Paris 21C, Berlin 18C.']),
];

/*
 * Agents offering loom's get_time, for runTools(): the SDK's tool parser
 * throws on a string in `tools` once it parses a tool call, so a client
 * that runs its own tools gets loom's from an agent (model agent/<name>).
 */
const agents = {
    timer: { model: 'runtools/fake-model', tools: ['get_time'],
             system_prompt: 'Answer briefly.' },
    timerstream: { model: 'runtoolsstream/fake-model', tools: ['get_time'],
                   system_prompt: 'Answer briefly.' },
};

const fakes = {
    basic: { loop: true, responses: [
        textResponse(['Hello', ' from', ' the fake.'])] },
    stream: { loop: true, responses: [
        textResponse(['Once', ' upon', ' a', ' time.'],
                     { chunk_delay_ms: 5 })] },
    servertool: { loop: true, responses: [
        { tool_calls: [{ id: 'call_time_1', name: 'get_time',
                         arguments: ['{"timezone":', '"Asia/Tokyo"}'] }],
          usage: { prompt_tokens: 20, completion_tokens: 5,
                   total_tokens: 25 } },
        textResponse(['It is late', ' in Tokyo.'])] },
    servertool2: { loop: true, responses: [
        { text: ['Let me check.'],
          tool_calls: [{ id: 'call_time_2', name: 'get_time',
                         arguments: '{"timezone":"UTC"}' }] },
        textResponse(['Done.'])] },
    clienttool: { loop: true, responses: [
        { tool_calls: [{ id: 'call_w1', name: 'get_weather',
                         arguments: ['{"city":', '"Paris"}'] }] },
        textResponse(['It is 21 degrees', ' in Paris.'])] },
    limited: {
        retries: 1,
        script: { loop: true, responses: [
            { status: 429, headers: { 'Retry-After': '0',
                                      'x-ratelimit-remaining-requests': '0' },
              error: { message: 'Rate limit reached for fake-model',
                       type: 'rate_limit_error',
                       code: 'rate_limit_exceeded' } }] },
    },
    unused: { loop: true, responses: [textResponse(['never'])] },
    runtools: { loop: true, responses: MIXED_ROUNDS },
    runtoolsstream: { loop: true, responses: MIXED_ROUNDS },
    inline: { loop: true, responses: [
        { tool_calls: [{ id: 'call_time_i', name: 'get_time',
                         arguments: '{"timezone":"UTC"}' }] },
        textResponse(['Noon.'])] },
    stringtools: { loop: true, responses: [
        { tool_calls: [{ id: 'call_time_s', name: 'get_time',
                         arguments: '{"timezone":"UTC"}' }] },
        textResponse(['It is', ' noon.'])] },
    hang: { loop: true, responses: [
        textResponse(['Partial ', 'answer'],
                     { hang: true, hang_after_chunks: 2 })] },
    structured: { loop: true, responses: [
        textResponse(['{"city":"Paris",', '"temp_c":21,',
                      '"conditions":["sunny","windy"]}'])] },
    vision: { loop: true, responses: [textResponse(['A red dot.'])] },
    novision: { loop: true, responses: [textResponse(['never'])] },
};

/* vision/fake-model takes images; every other model does not. */
const models = {
    'vision/fake-model': { capabilities: { vision: true } },
};

/* A 1x1 PNG as a data: URL. */
const PNG_URL = 'data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYA' +
    'AAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==';

/* The weather report the structured-output test asks for. */
const Weather = z.object({
    city: z.string(),
    temp_c: z.number(),
    conditions: z.array(z.string()),
});

/* The client's own weather tool, for runTools(); asked notes each city. */
function weatherTool(asked) {
    return {
        type: 'function',
        function: {
            ...WEATHER_TOOL.function,
            function: ({ city }) => {
                asked.push(city);
                return JSON.stringify({ temp_c: city === 'Paris' ? 21 : 18 });
            },
            parse: JSON.parse,
        },
    };
}

/* The run id behind a chat completion id. */
function runIdOf(chatId) {
    return `run_${chatId.slice('chatcmpl-'.length)}`;
}

/* Polls loom's run object until the run has ended; returns it. */
async function endedRun(stack, runId) {
    for (let i = 0; i < 1500; i++) {
        const r = await stack.get(`/v1/runs/${runId}`);
        assert.equal(r.status, 200);
        if (r.body.status !== 'running')
            return r.body;
        await new Promise((resolve) => setTimeout(resolve, 20));
    }
    throw new Error(`run ${runId} still running`);
}

/* Reads a stream chunk by chunk, noting every delta kind in order. */
async function collect(stream) {
    const out = { order: [], content: '', toolCalls: [], loomToolCalls: [],
                  toolOutputs: [], finish: null, conversationId: null,
                  ids: new Set() };
    for await (const chunk of stream) {
        out.ids.add(chunk.id);
        if (chunk.conversation_id)
            out.conversationId = chunk.conversation_id;
        const c = chunk.choices[0];
        if (!c)
            continue;
        if (c.delta.tool_calls) {
            out.order.push('tool_calls');
            out.toolCalls.push(...c.delta.tool_calls);
        }
        if (c.delta.loom_tool_calls) {
            out.order.push('loom_tool_calls');
            out.loomToolCalls.push(...c.delta.loom_tool_calls);
        }
        if (c.delta.tool_output) {
            out.order.push('tool_output');
            out.toolOutputs.push(c.delta.tool_output);
        }
        if (c.delta.content) {
            out.order.push('content');
            out.content += c.delta.content;
        }
        if (c.finish_reason)
            out.finish = c.finish_reason;
    }
    return out;
}

describe('openai SDK against loom serve', () => {
    let stack;
    let client;

    before(async () => {
        stack = await Stack.start({ fakes, agents, models });
        client = stack.client();
    }, { timeout: 30000 });

    after(async () => {
        if (stack)
            await stack.close();
    }, { timeout: 60000 });

    test('non-streamed answer, stored and continued', TIMEOUT, async () => {
        const { data, response } = await client.chat.completions.create({
            model: 'basic/fake-model',
            messages: [{ role: 'user', content: 'Say hello' }],
        }).withResponse();

        assert.equal(data.object, 'chat.completion');
        assert.match(data.id, /^chatcmpl-/);
        assert.equal(data.model, 'basic/fake-model');
        assert.equal(data.choices.length, 1);
        assert.equal(data.choices[0].finish_reason, 'stop');
        assert.equal(data.choices[0].message.role, 'assistant');
        assert.equal(data.choices[0].message.content, 'Hello from the fake.');
        /* OpenAI's fields, then loom's; no prices: the cost is unknown. */
        assert.deepEqual(data.usage, { prompt_tokens: 10,
                                       completion_tokens: 3,
                                       total_tokens: 13,
                                       cached_tokens: 0,
                                       reasoning_tokens: 0,
                                       cache_write_tokens: 0,
                                       cost_micros: null });
        assert.match(data.conversation_id, /^conv_[0-9a-f]{24}$/);
        assert.equal(response.headers.get('x-loom-conversation-id'),
                     data.conversation_id);

        /* What reached the provider: its own model id, loom's key. */
        const reqs = stack.fakeRequests('basic');
        assert.equal(reqs.length, 1);
        assert.equal(reqs[0].path, '/v1/chat/completions');
        assert.equal(reqs[0].headers.authorization, `Bearer ${API_KEY}`);
        assert.equal(reqs[0].body.model, 'fake-model');
        assert.deepEqual(reqs[0].body.messages,
                         [{ role: 'user', content: 'Say hello' }]);

        const conv = await stack.get(
            `/v1/conversations/${data.conversation_id}`);
        assert.equal(conv.status, 200);
        assert.deepEqual(conv.body.messages.map((m) => [m.role, m.content]),
                         [['user', 'Say hello'],
                          ['assistant', 'Hello from the fake.']]);

        /* The next turn names the conversation and sends only what is
         * new; the stored history goes upstream with it. */
        const next = await client.chat.completions.create({
            model: 'basic/fake-model',
            conversation_id: data.conversation_id,
            messages: [{ role: 'user', content: 'Again' }],
        });
        assert.equal(next.conversation_id, data.conversation_id);
        assert.equal(next.choices[0].message.content, 'Hello from the fake.');
        const reqs2 = stack.fakeRequests('basic');
        assert.equal(reqs2.length, 2);
        assert.deepEqual(
            reqs2[1].body.messages.map((m) => [m.role, m.content]),
            [['user', 'Say hello'], ['assistant', 'Hello from the fake.'],
             ['user', 'Again']]);
        const conv2 = await stack.get(
            `/v1/conversations/${data.conversation_id}`);
        assert.equal(conv2.body.messages.length, 4);
    });

    test('streamed answer accumulated by the SDK stream helper', TIMEOUT,
         async () => {
        const stream = client.chat.completions.stream({
            model: 'stream/fake-model',
            messages: [{ role: 'user', content: 'Tell a story' }],
            stream_options: { include_usage: true },
        });
        const deltas = [];
        let conversationId = null;
        let chunks = 0;
        stream.on('chunk', (chunk) => {
            if (chunks++ === 0)
                conversationId = chunk.conversation_id;
        });
        stream.on('content', (delta) => deltas.push(delta));

        const final = await stream.finalChatCompletion();
        assert.deepEqual(deltas, ['Once', ' upon', ' a', ' time.']);
        assert.equal(await stream.finalContent(), 'Once upon a time.');
        assert.equal(final.choices[0].message.content, 'Once upon a time.');
        assert.equal(final.choices[0].finish_reason, 'stop');
        assert.equal(final.usage.total_tokens, 14);
        assert.equal(final.model, 'stream/fake-model');
        /* role chunk, 4 text chunks, finish chunk, usage chunk */
        assert.equal(chunks, 7);
        assert.match(conversationId, /^conv_/);

        const conv = await stack.get(`/v1/conversations/${conversationId}`);
        assert.equal(conv.status, 200);
        const last = conv.body.messages.at(-1);
        assert.equal(last.role, 'assistant');
        assert.equal(last.content, 'Once upon a time.');
        assert.equal(last.status, 'ok');
    });

    test('server-side tool by name: loom_tool_calls and tool_output deltas',
         TIMEOUT, async () => {
        const stream = await client.chat.completions.create({
            model: 'servertool/fake-model',
            stream: true,
            tools: ['get_time'],
            messages: [{ role: 'user', content: 'Time in Tokyo?' }],
        });
        /* One copy read chunk by chunk, the other accumulated by the
         * SDK's helper (which does not look at the request's tools). */
        const [raw, copy] = stream.tee();
        const acc = ChatCompletionStream.fromReadableStream(
            copy.toReadableStream());
        const got = await collect(raw);
        const final = await acc.finalChatCompletion();

        /* loom's own call is not the client's to answer: it is in
         * loom_tool_calls, never in tool_calls. */
        assert.deepEqual(got.order, ['loom_tool_calls', 'tool_output',
                                     'content', 'content']);
        assert.equal(got.ids.size, 1);
        assert.deepEqual(got.toolCalls, []);
        assert.deepEqual(got.loomToolCalls, [{
            index: 0, id: 'call_time_1', type: 'function',
            function: { name: 'get_time',
                        arguments: '{"timezone":"Asia/Tokyo"}' } }]);
        assert.equal(got.toolOutputs.length, 1);
        const out = got.toolOutputs[0];
        assert.equal(out.tool_call_id, 'call_time_1');
        assert.equal(out.name, 'get_time');
        const time = JSON.parse(out.output);
        assert.equal(time.timezone, 'Asia/Tokyo');
        assert.equal(time.utc_offset, '+09:00');
        assert.ok(Math.abs(time.unix - Date.now() / 1000) < 86400,
                  `get_time said ${time.unix}`);
        assert.equal(got.content, 'It is late in Tokyo.');
        assert.equal(got.finish, 'stop');

        const msg = final.choices[0].message;
        assert.equal(msg.content, 'It is late in Tokyo.');
        assert.equal(msg.tool_calls, undefined);
        assert.equal(final.choices[0].finish_reason, 'stop');

        /* loom offered the tool's full spec and answered the call itself
         * with the output the client saw. */
        const reqs = stack.fakeRequests('servertool');
        assert.equal(reqs.length, 2);
        assert.equal(reqs[0].body.tools[0].type, 'function');
        assert.equal(reqs[0].body.tools[0].function.name, 'get_time');
        assert.equal(reqs[0].body.tools[0].function.parameters.type,
                     'object');
        const sent = reqs[1].body.messages;
        assert.equal(sent.at(-2).role, 'assistant');
        assert.equal(sent.at(-2).tool_calls[0].id, 'call_time_1');
        assert.equal(sent.at(-1).role, 'tool');
        assert.equal(sent.at(-1).tool_call_id, 'call_time_1');
        assert.equal(sent.at(-1).content, out.output);

        const conv = await stack.get(
            `/v1/conversations/${got.conversationId}`);
        assert.equal(conv.status, 200);
        assert.deepEqual(conv.body.messages.map((m) => m.role),
                         ['user', 'assistant', 'tool', 'assistant']);
        assert.equal(conv.body.messages[1].tool_calls[0].name, 'get_time');
        assert.equal(conv.body.messages[2].content, out.output);
        assert.equal(conv.body.messages[3].content, 'It is late in Tokyo.');
    });

    test('server-side tool, non-streamed: tool_events', TIMEOUT,
         async () => {
        const r = await client.chat.completions.create({
            model: 'servertool2/fake-model',
            tools: ['get_time'],
            messages: [{ role: 'user', content: 'Time in UTC?' }],
        });
        assert.equal(r.choices[0].finish_reason, 'stop');
        assert.equal(r.choices[0].message.content, 'Done.');
        assert.equal(r.choices[0].message.tool_calls, undefined);
        assert.deepEqual(r.tool_events.map((e) => e.type),
                         ['text', 'tool_call', 'tool_output', 'text']);
        assert.equal(r.tool_events[1].value.function.name, 'get_time');
        assert.equal(r.tool_events[2].value.tool_call_id, 'call_time_2');
        assert.equal(JSON.parse(r.tool_events[2].value.output).timezone,
                     'UTC');
    });

    test('client tool returned to the client, then the follow-up', TIMEOUT,
         async () => {
        const messages = [{ role: 'user', content: 'Weather in Paris?' }];
        const stream = client.chat.completions.stream({
            model: 'clienttool/fake-model',
            tools: [WEATHER_TOOL],
            messages,
        });
        const done = [];
        let conversationId = null;
        stream.on('chunk', (c) => {
            conversationId ??= c.conversation_id;
        });
        stream.on('tool_calls.function.arguments.done',
                  (e) => done.push([e.name, e.arguments]));
        const first = await stream.finalChatCompletion();

        assert.equal(first.choices[0].finish_reason, 'tool_calls');
        const call = first.choices[0].message.tool_calls;
        assert.equal(call.length, 1);
        assert.equal(call[0].id, 'call_w1');
        assert.equal(call[0].function.name, 'get_weather');
        assert.equal(call[0].function.arguments, '{"city":"Paris"}');
        assert.deepEqual(done, [['get_weather', '{"city":"Paris"}']]);
        assert.match(conversationId, /^conv_/);
        assert.equal(stack.fakeRequests('clienttool').length, 1);

        /* The client runs the tool and sends its whole history back, as a
         * chat UI does, naming the conversation. */
        messages.push(first.choices[0].message);
        messages.push({ role: 'tool', tool_call_id: 'call_w1',
                        content: '{"temp_c":21}' });
        const second = await client.chat.completions.create({
            model: 'clienttool/fake-model',
            tools: [WEATHER_TOOL],
            conversation_id: conversationId,
            messages,
        });
        assert.equal(second.choices[0].finish_reason, 'stop');
        assert.equal(second.choices[0].message.content,
                     'It is 21 degrees in Paris.');
        assert.equal(second.conversation_id, conversationId);

        const reqs = stack.fakeRequests('clienttool');
        assert.equal(reqs.length, 2);
        assert.equal(reqs[0].body.tools[0].function.name, 'get_weather');
        const sent = reqs[1].body.messages;
        assert.deepEqual(sent.map((m) => m.role),
                         ['user', 'assistant', 'tool']);
        assert.equal(sent[1].tool_calls[0].id, 'call_w1');
        assert.equal(sent[1].tool_calls[0].function.name, 'get_weather');
        assert.equal(sent[2].tool_call_id, 'call_w1');
        assert.equal(sent[2].content, '{"temp_c":21}');

        /* Stored once each: the resent history was not added again. */
        const conv = await stack.get(`/v1/conversations/${conversationId}`);
        assert.deepEqual(conv.body.messages.map((m) => m.role),
                         ['user', 'assistant', 'tool', 'assistant']);
        assert.equal(conv.body.messages[1].tool_calls[0].id, 'call_w1');
        assert.equal(conv.body.messages[2].content, '{"temp_c":21}');
    });

    test('upstream 429 surfaces as RateLimitError', TIMEOUT, async () => {
        const err = await client.chat.completions.create({
            model: 'limited/fake-model',
            messages: [{ role: 'user', content: 'Hi' }],
        }).then(() => null, (e) => e);

        assert.ok(err instanceof OpenAI.RateLimitError,
                  `got ${err && err.constructor.name}: ${err}`);
        assert.equal(err.status, 429);
        assert.equal(err.type, 'rate_limit_error');
        assert.equal(err.code, 'rate_limit_exceeded');
        assert.match(err.message, /Rate limit reached for fake-model/);
        /* The upstream's rate-limit headers reach the client. */
        assert.equal(err.headers.get('retry-after'), '0');
        assert.equal(err.headers.get('x-ratelimit-remaining-requests'), '0');
        /* loom retried once (retries.max: 1) before giving up */
        assert.equal(stack.fakeRequests('limited').length, 2);

        /* The failed turn is stored, and visible. */
        const id = err.headers.get('x-loom-conversation-id');
        assert.match(id, /^conv_/);
        const conv = await stack.get(`/v1/conversations/${id}`);
        assert.equal(conv.status, 200);
        assert.equal(conv.body.messages.at(-1).role, 'assistant');
        assert.equal(conv.body.messages.at(-1).status, 'error');
    });

    test('upstream 429 while streaming surfaces as RateLimitError',
         TIMEOUT, async () => {
        /* loom holds a stream's status until the run has output, so a
         * run that fails first answers 429 like OpenAI itself. */
        const err = await client.chat.completions.create({
            model: 'limited/fake-model',
            stream: true,
            messages: [{ role: 'user', content: 'Hi' }],
        }).then(collect).then(() => null, (e) => e);
        assert.ok(err instanceof OpenAI.RateLimitError,
                  `got ${err && err.constructor.name}: ${err}`);
        assert.equal(err.status, 429);
        assert.match(err.message, /Rate limit reached for fake-model/);
        assert.match(err.headers.get('x-loom-conversation-id'), /^conv_/);
        assert.equal(err.headers.get('retry-after'), '0');
    });

    test('a bad body surfaces as BadRequestError', TIMEOUT, async () => {
        const bad = async (body) => {
            const err = await client.chat.completions.create({
                model: 'unused/fake-model',
                messages: [{ role: 'user', content: 'Hi' }],
                ...body,
            }).then(() => null, (e) => e);
            assert.ok(err instanceof OpenAI.BadRequestError,
                      `got ${err && err.constructor.name}: ${err}`);
            assert.equal(err.status, 400);
            assert.equal(err.type, 'invalid_request_error');
            return err;
        };

        let err = await bad({ messages: 'Hi' });
        assert.equal(err.param, 'messages');
        assert.equal(err.code, 'invalid_type');

        err = await bad({ messages: [{ role: 'wizard', content: 'Hi' }] });
        assert.equal(err.param, 'messages[0].role');

        err = await bad({ temperature: 7 });
        assert.equal(err.param, 'temperature');

        err = await bad({ tools: ['get_time', 'no_such_tool'] });
        assert.equal(err.code, 'unknown_tool');
        assert.equal(err.param, 'tools[1]');
        assert.match(err.message, /get_time/);

        /* an unknown model is a 404 in OpenAI's shape */
        err = await client.chat.completions.create({
            model: 'nobody/fake-model',
            messages: [{ role: 'user', content: 'Hi' }],
        }).then(() => null, (e) => e);
        assert.ok(err instanceof OpenAI.NotFoundError,
                  `got ${err && err.constructor.name}: ${err}`);
        assert.equal(err.code, 'model_not_found');

        /* none of these reached the provider */
        assert.equal(stack.fakeRequests('unused').length, 0);
    });
    test('the inline shape: loom\'s calls in tool_calls, on request',
         TIMEOUT, async () => {
        const got = await collect(await client.chat.completions.create({
            model: 'inline/fake-model',
            stream: true,
            tools: ['get_time'],
            messages: [{ role: 'user', content: 'Time?' }],
        }, { headers: { 'X-Loom-Server-Tool-Calls': 'inline' } }));
        assert.deepEqual(got.order, ['tool_calls', 'tool_output',
                                     'content']);
        assert.equal(got.toolCalls[0].function.name, 'get_time');
        assert.deepEqual(got.loomToolCalls, []);
        assert.equal(got.finish, 'stop');
    });

    test('.stream() with string tools', TIMEOUT, async () => {
        const stream = client.chat.completions.stream({
            model: 'stringtools/fake-model',
            tools: ['get_time'],
            messages: [{ role: 'user', content: 'Time in UTC?' }],
        });
        const final = await stream.finalChatCompletion();
        assert.equal(final.choices[0].message.content, 'It is noon.');
        assert.equal(final.choices[0].message.tool_calls, undefined);
        assert.equal(final.choices[0].finish_reason, 'stop');
        /* loom answered its own call upstream. */
        const reqs = stack.fakeRequests('stringtools');
        assert.equal(reqs.length, 2);
        assert.equal(reqs[1].body.messages.at(-1).tool_call_id,
                     'call_time_s');
    });

    for (const stream of [false, true]) {
        const fake = stream ? 'runtoolsstream' : 'runtools';
        const agent = stream ? 'timerstream' : 'timer';
        test(`runTools() (${stream ? 'streamed' : 'not streamed'}) mixes ` +
             'loom\'s tools and the client\'s', TIMEOUT, async () => {
            const asked = [];
            const runner = client.chat.completions.runTools({
                model: `agent/${agent}`,
                stream,
                tools: [weatherTool(asked)],
                messages: [{ role: 'user',
                             content: 'Time and weather in Paris, Berlin?' }],
            });
            assert.equal(await runner.finalContent(),
                         'Paris 21C, Berlin 18C.');
            /* The client answered its own calls, only those. */
            assert.deepEqual(asked, ['Paris', 'Berlin']);

            /* Three requests from the SDK, four model calls: loom
             * answered get_time itself within the first two. */
            const reqs = stack.fakeRequests(fake);
            assert.equal(reqs.length, 4);
            const tools = (r) => r.body.messages.filter(
                (m) => m.role === 'tool');
            for (const r of reqs)
                for (const m of tools(r))
                    assert.doesNotMatch(m.content, /Invalid tool_call/);
            const t1 = tools(reqs[1]).find(
                (m) => m.tool_call_id === 'call_t1');
            assert.equal(JSON.parse(t1.content).timezone, 'Europe/Paris');
            assert.equal(tools(reqs[2]).find(
                (m) => m.tool_call_id === 'call_w1').content,
                         '{"temp_c":21}');
            assert.equal(tools(reqs[3]).find(
                (m) => m.tool_call_id === 'call_w2').content,
                         '{"temp_c":18}');
        });
    }

    test('.abort() mid-stream cancels the run, which is stored', TIMEOUT,
         async () => {
        const stream = client.chat.completions.stream({
            model: 'hang/fake-model',
            messages: [{ role: 'user', content: 'Talk' }],
        });
        let runId = null;
        try {
            for await (const chunk of stream) {
                runId ??= runIdOf(chunk.id);
                if (chunk.choices[0]?.delta?.content) {
                    stream.abort();
                    break;
                }
            }
        } catch (e) {
            assert.ok(e instanceof OpenAI.APIUserAbortError,
                      `got ${e && e.constructor.name}: ${e}`);
        }
        assert.ok(runId);
        const run = await endedRun(stack, runId);
        assert.equal(run.status, 'cancelled');
        assert.equal(run.stored, true);
        const conv = await stack.get(
            `/v1/conversations/${run.conversation_id}`);
        assert.equal(conv.body.messages.at(-1).status, 'cancelled');
        assert.match(conv.body.messages.at(-1).content, /^Partial/);
    });

    test('a cancelled stream ends normally for the SDK', TIMEOUT,
         async () => {
        const stream = client.chat.completions.stream({
            model: 'hang/fake-model',
            stream_options: { include_usage: true },
            messages: [{ role: 'user', content: 'Talk' }],
        });
        let cancel = null;
        let status = null;
        let runId = null;
        stream.on('chunk', (chunk) => {
            runId ??= runIdOf(chunk.id);
            status ??= chunk.loom_status ?? null;
            if (!cancel && chunk.choices[0]?.delta?.content)
                cancel = fetch(`${stack.baseURL}/v1/runs/${runId}/cancel`,
                               { method: 'POST' });
        });
        /* No APIError: a user's stop is not a failure. */
        const final = await stream.finalChatCompletion();
        assert.equal((await cancel).status, 200);
        assert.equal(final.choices[0].finish_reason, 'stop');
        assert.match(final.choices[0].message.content, /^Partial/);
        assert.equal(status, 'cancelled');
        assert.equal(final.usage.cost_micros, null);
        const run = await endedRun(stack, runId);
        assert.equal(run.status, 'cancelled');
        assert.equal(run.stored, true);
    });
    test('response_format json_schema parsed by .parse() with zod',
         TIMEOUT, async () => {
        const format = zodResponseFormat(Weather, 'weather');
        const r = await client.chat.completions.parse({
            model: 'structured/fake-model',
            messages: [{ role: 'user', content: 'Weather in Paris?' }],
            response_format: format,
        });
        const msg = r.choices[0].message;
        assert.equal(r.choices[0].finish_reason, 'stop');
        assert.deepEqual(msg.parsed, { city: 'Paris', temp_c: 21,
                                       conditions: ['sunny', 'windy'] });
        assert.equal(msg.refusal ?? null, null);

        /* The schema went upstream as the SDK wrote it. */
        const reqs = stack.fakeRequests('structured');
        assert.equal(reqs.length, 1);
        const sent = reqs[0].body.response_format;
        assert.deepEqual(sent, JSON.parse(JSON.stringify(format)));
        assert.equal(sent.type, 'json_schema');
        assert.equal(sent.json_schema.name, 'weather');
        assert.equal(sent.json_schema.strict, true);
        assert.deepEqual(sent.json_schema.schema.required,
                         ['city', 'temp_c', 'conditions']);
        assert.equal(sent.json_schema.schema.properties.conditions.type,
                     'array');
    });

    test('an image part reaches a vision model', TIMEOUT, async () => {
        const content = [
            { type: 'text', text: 'What is in this picture?' },
            { type: 'image_url', image_url: { url: PNG_URL,
                                              detail: 'low' } },
        ];
        const r = await client.chat.completions.create({
            model: 'vision/fake-model',
            messages: [{ role: 'user', content }],
        });
        assert.equal(r.choices[0].message.content, 'A red dot.');

        const reqs = stack.fakeRequests('vision');
        assert.equal(reqs.length, 1);
        const user = reqs[0].body.messages.at(-1);
        assert.equal(user.role, 'user');
        assert.deepEqual(user.content, content);

        /* A model without vision refuses it before any model call. */
        const err = await client.chat.completions.create({
            model: 'novision/fake-model',
            messages: [{ role: 'user', content }],
        }).then(() => null, (e) => e);
        assert.ok(err instanceof OpenAI.BadRequestError,
                  `got ${err && err.constructor.name}: ${err}`);
        assert.equal(err.code, 'model_not_vision');
        assert.equal(err.param, 'messages[0].content');
        assert.equal(stack.fakeRequests('novision').length, 0);
    });

    test('models.list() shows the agents, models.retrieve() one',
         TIMEOUT, async () => {
        const list = [];
        for await (const m of client.models.list())
            list.push(m);
        const ids = list.map((m) => m.id);
        assert.ok(ids.includes('vision/fake-model'), ids.join(' '));
        const agentIds = ids.filter((id) => id.startsWith('agent/')).sort();
        assert.deepEqual(agentIds, ['agent/timer', 'agent/timerstream']);
        const timer = list.find((m) => m.id === 'agent/timer');
        assert.equal(timer.object, 'model');
        assert.equal(timer.owned_by, 'loom');
        assert.deepEqual(timer.loom, { agent: 'timer',
                                       model: 'runtools/fake-model' });

        /* The SDK sends the id's slash as %2F. */
        const one = await client.models.retrieve('agent/timer');
        assert.deepEqual(one, timer);
        const model = await client.models.retrieve('vision/fake-model');
        assert.equal(model.id, 'vision/fake-model');
        assert.equal(model.owned_by, 'vision');

        const err = await client.models.retrieve('agent/nobody')
            .then(() => null, (e) => e);
        assert.ok(err instanceof OpenAI.NotFoundError,
                  `got ${err && err.constructor.name}: ${err}`);
        assert.equal(err.code, 'model_not_found');
    });
});

/*
 * Peer: the Vercel AI SDK (ai + @ai-sdk/openai), streamText over the Chat
 * Completions model (openai.chat), one no-op tool, multi-step until the
 * model stops calling tools (stopWhen: stepCountIs(10)). One run is the
 * whole fullStream consumed to its end; model calls are its steps.
 */
import { createOpenAI } from '@ai-sdk/openai';
import { stepCountIs, streamText, tool } from 'ai';
import { z } from 'zod';
import { bench, PROMPT, versionOf } from './common.mjs';

await bench({
  name: 'vercel-ai-sdk',
  version:
    `ai ${versionOf('ai')}, ` +
    `@ai-sdk/openai ${versionOf('@ai-sdk/openai')}`,
  setup(baseURL) {
    const openai = createOpenAI({ apiKey: 'sk-bench', baseURL });
    const model = openai.chat('fake-model');
    const tools = {
      noop: tool({
        description: 'Does nothing and says ok.',
        inputSchema: z.object({}),
        execute: async () => 'ok',
      }),
    };
    return async () => {
      const result = streamText({
        model,
        prompt: PROMPT,
        tools,
        stopWhen: stepCountIs(10),
        maxRetries: 0,
      });
      /* A minimal consumer, like loom-bench's counting sink. */
      let events = 0;
      for await (const part of result.fullStream) {
        if (part.type === 'error') throw part.error;
        events++;
      }
      return {
        text: await result.text,
        modelCalls: (await result.steps).length,
      };
    };
  },
});
process.exit(0);

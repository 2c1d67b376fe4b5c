/*
 * Peer: the OpenAI Agents JS SDK (@openai/agents), Chat Completions model,
 * streaming, tracing disabled, one no-op function tool. One run is
 * Runner.run(agent, prompt, {stream: true}) consumed to its end; the model
 * calls it made are counted from the run's raw model responses.
 */
import OpenAI from 'openai';
import {
  Agent,
  OpenAIChatCompletionsModel,
  Runner,
  setTracingDisabled,
  tool,
} from '@openai/agents';
import { z } from 'zod';
import { bench, PROMPT, versionOf } from './common.mjs';

setTracingDisabled(true);

await bench({
  name: 'openai-agents',
  version:
    `@openai/agents ${versionOf('@openai/agents')}, ` +
    `openai ${versionOf('openai')}`,
  setup(baseURL) {
    const client = new OpenAI({ apiKey: 'sk-bench', baseURL, maxRetries: 0 });
    const noop = tool({
      name: 'noop',
      description: 'Does nothing and says ok.',
      parameters: z.object({}),
      execute: async () => 'ok',
    });
    const agent = new Agent({
      name: 'bench',
      model: new OpenAIChatCompletionsModel(client, 'fake-model'),
      tools: [noop],
    });
    const runner = new Runner({ tracingDisabled: true });
    return async () => {
      const result = await runner.run(agent, PROMPT, {
        stream: true,
        maxTurns: 20,
      });
      /* A minimal consumer, like loom-bench's counting sink. */
      let events = 0;
      for await (const ev of result) {
        if (ev) events++;
      }
      await result.completed;
      return {
        text: result.finalOutput,
        modelCalls: result.rawResponses.length,
      };
    };
  },
});
process.exit(0);

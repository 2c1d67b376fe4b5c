/*
 * The web UI in a real browser (docs/ui.md): Chromium driven by
 * playwright-core against `loom serve` and the fake upstream. Sending and
 * streaming, Stop (the upstream request really aborted, the answer stored
 * as cancelled), a reload mid-answer, a tool card through approval, cost
 * equal to the run's usage, untrusted text that must run nothing, the
 * pages' security headers, axe-core, and `server.ui: false`. Screenshots
 * of the main views are saved as artefacts (browser.mjs).
 */
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { LOOM_BIN, Stack, closeServer, teardown,
         textResponse } from '../e2e/harness.mjs';
import { conversationId, launch, openPage, sendMessage, shot,
         until } from './browser.mjs';

const require = (await import('node:module')).createRequire(import.meta.url);
const AXE = fs.readFileSync(require.resolve('axe-core/axe.min.js'), 'utf8');

const TITLE = 'Write a short title';
const XSS_IMG = '<img src=x onerror=alert(1)>';
const XSS_TOOL = '<img src=x onerror=alert(3)><script>alert(4)</script>';
const slow = Array.from({ length: 20 }, (_, i) => `w${i + 1} `);

const plan = { goal: 'Answer', tasks: [
    { id: '1', description: 'Ask the helper', status: 'in_progress',
      tools: ['helper'] }] };

const script = {
    rules: [
        { match: { system: TITLE, any_message: 'xss please' }, loop: true,
          responses: [{ text: [`${XSS_IMG} title`] }] },
        { match: { system: TITLE }, loop: true,
          responses: [textResponse(['Friendly greeting'])] },
        { match: { first_user: 'stream please' }, loop: true,
          responses: [textResponse(['Hello ', '**world**', '!'])] },
        { match: { first_user: 'hang please' },
          responses: [{ text: ['partial answer'], hang: true,
                        hang_after_chunks: 2 }] },
        { match: { first_user: 'slow please' },
          responses: [textResponse(slow, { chunk_delay_ms: 150 })] },
        { match: { first_user: 'tool please' },
          responses: [
              { tool_calls: [{ id: 'call_t1', name: 'get_time',
                               arguments: '{"timezone":"UTC"}' }] },
              textResponse(['The time is known.'])] },
        { match: { first_user: 'find the time' },
          responses: [
              { tool_calls: [{ id: 'h1', name: 'get_time',
                               arguments: '{"timezone":"UTC"}' }] },
              textResponse(['helper says noon'])] },
        { match: { first_user: 'structure please' },
          responses: [
              { reasoning: ['Let me plan.'],
                tool_calls: [{ id: 'p1', name: 'todo_write',
                               arguments: JSON.stringify(plan) }] },
              { tool_calls: [{ id: 's1', name: 'helper',
                               arguments: '{"task":"find the time"}' }] },
              textResponse(['All done.'])] },
        { match: { first_user: 'deny please' },
          responses: [
              { tool_calls: [{ id: 'call_d1', name: 'get_time',
                               arguments: '{"timezone":"UTC"}' }] },
              textResponse(['Understood.'])] },
        { match: { first_user: 'code please' },
          responses: [textResponse(['```js\nconst x = 1;\n```\n'])] },
        /* A deep research run: the supervisor's phases told apart by the
         * system prompts each adds; researcher beta's model call fails. */
        { match: { first_user: 'alpha topic' }, loop: true,
          responses: [textResponse(['Alpha findings.'])] },
        { match: { first_user: 'beta topic' }, loop: true,
          responses: [{ status: 500, error: { message: 'beta broke' } }] },
        { match: { first_user: 'research please',
                   system: 'Write the final report' },
          responses: [textResponse(['Alpha is **true**.'])] },
        { match: { first_user: 'research please', system: 'Research cycle',
                   tools_include: ['research_agent'] },
          responses: [
              { tool_calls: [
                  { id: 'ra', name: 'research_agent',
                    arguments: '{"task":"alpha topic"}' },
                  { id: 'rb', name: 'research_agent',
                    arguments: '{"task":"beta topic"}' }] },
              { tool_calls: [{ id: 'rg', name: 'generate_report',
                               arguments: '{}' }] }] },
        { match: { first_user: 'research please',
                   system: 'Write the research plan' },
          responses: [textResponse(['1. alpha\n', '2. beta'])] },
        { match: { first_user: 'research please',
                   system: 'Before any research starts' },
          responses: [textResponse(['NO_CLARIFICATION_NEEDED'])] },
        { match: { first_user: 'xss please' }, loop: true,
          responses: [{ text: [
              `${XSS_IMG} and <script>alert(2)</script> `,
              '[a link](https://example.com/) end'] }] },
        { match: { last_message: 'fruit: apples?' }, loop: true,
          responses: [textResponse(['Apples are red.'])] },
        { match: { last_message: 'fruit: pears?' }, loop: true,
          responses: [textResponse(['Pears are green.'])] },
        { match: { first_user: 'hostile tool output' },
          responses: [
              { tool_calls: [{ id: 'call_x', name: 'get_time',
                               arguments: JSON.stringify(
                                   { timezone: XSS_TOOL }) }] },
              { text: ['tool said no'] }] },
    ],
};

const models = { 'fake/m': { prices: { input: 1, output: 2 } } };
const agents = {
    careful: { model: 'fake/m', tools: ['get_time'],
               tool_options: { get_time: { approval: 'required' } } },
    boss: { model: 'fake/m', planning: true, sub_agents: ['helper'],
            tools: [] },
    helper: { model: 'fake/m', tools: ['get_time'] },
};

/* The critical violations axe-core finds on the page ("id: help"). */
async function axeCritical(page) {
    await page.evaluate(AXE);
    const result = await page.evaluate(() => window.axe.run());
    return result.violations.filter((v) => v.impact === 'critical')
        .map((v) => `${v.id}: ${v.help}`);
}

async function fakeStats(stack) {
    const res = await fetch(
        `http://127.0.0.1:${stack.fakes.fake.port}/_fake/stats`);
    return res.json();
}

/* A suite's hooks: env.stack (Stack.start(opts)) and env.browser before
 * its tests, both closed after them (each also when the other's close
 * failed; the failures are the hook's). */
function useStack(env, opts) {
    before(async () => {
        env.stack = await Stack.start(opts);
        env.browser = await launch();
    });
    after(() => teardown([env.browser && (() => env.browser.close()),
                          env.stack && (() => env.stack.close())]));
}

function answer(page) {
    return page.locator('article.assistant').last();
}

/* The messages of the answer's conversation, as stored. */
async function stored(stack, cid) {
    const r = await stack.get(`/v1/conversations/${cid}`);
    assert.equal(r.status, 200);
    return r.body;
}

describe('web UI in Chromium', () => {
    const env = {};
    useStack(env, { fakes: { fake: script }, models, agents });
    let stack;
    let browser;
    before(() => ({ stack, browser } = env));

    test('pages carry a strict CSP, nosniff, no referrer, and ETags', async () => {
        const res = await fetch(`${stack.baseURL}/`);
        assert.equal(res.status, 200);
        assert.match(res.headers.get('content-type'), /^text\/html/);
        const csp = res.headers.get('content-security-policy');
        assert.match(csp, /default-src 'self'/);
        assert.match(csp, /script-src 'self';/);
        assert.match(csp, /connect-src 'self'/);
        assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval/);
        assert.equal(res.headers.get('x-content-type-options'), 'nosniff');
        assert.equal(res.headers.get('referrer-policy'), 'no-referrer');
        assert.match(await res.text(), /<textarea id="message"/);

        const js = await fetch(`${stack.baseURL}/assets/app.js`);
        assert.equal(js.status, 200);
        assert.match(js.headers.get('content-type'), /^text\/javascript/);
        const etag = js.headers.get('etag');
        assert.match(etag, /^"[0-9a-f]+"$/);
        const again = await fetch(`${stack.baseURL}/assets/app.js`,
                                  { headers: { 'If-None-Match': etag } });
        assert.equal(again.status, 304);
        assert.equal(again.headers.get('etag'), etag);
        assert.ok(again.headers.get('content-security-policy'));

        for (const p of ['/assets/vendor/marked.esm.js',
                         '/assets/vendor/purify.es.mjs', '/assets/style.css'])
            assert.equal((await fetch(`${stack.baseURL}${p}`)).status, 200, p);
        assert.equal((await fetch(`${stack.baseURL}/assets/nope.js`)).status,
                     404);
    });

    test('Enter sends, the answer streams as Markdown, the title arrives',
         async () => {
        const { page, context, seen } = await openPage(browser, stack);
        await page.getByRole('navigation', { name: 'Conversations' }).waitFor();
        for (const name of ['Send', 'Stop', 'Regenerate', 'New chat'])
            await page.getByRole('button', { name, exact: true }).waitFor();
        const box = page.getByRole('textbox', { name: 'Message' });

        /* Shift+Enter is a new line, not a send. */
        await box.fill('line one');
        await box.press('Shift+Enter');
        await box.pressSequentially('line two');
        assert.equal(await box.inputValue(), 'line one\nline two');
        assert.equal(await page.locator('article.user').count(), 0);

        await box.fill('stream please');
        await box.press('Enter');
        await answer(page).and(page.locator('[data-status="completed"]'))
            .waitFor();
        assert.equal(await box.inputValue(), '');
        assert.equal(await page.locator('article.user').innerText(),
                     'stream please');
        assert.equal(await answer(page).locator('.flow strong').innerText(),
                     'world');
        assert.match(await answer(page).locator('.flow').innerText(),
                     /Hello world!/);
        const cid = await conversationId(page);
        const item = page.locator(`#conversations li[data-id="${cid}"]`);
        await item.getByText('Friendly greeting').waitFor();
        assert.equal(await page.locator('#chat-title').innerText(),
                     'Friendly greeting');
        assert.ok(await page.getByRole('button', { name: 'Regenerate' })
            .isEnabled());
        await shot(page, 'chat');

        /* Regenerate asks again in the same conversation. */
        await page.getByRole('button', { name: 'Regenerate' }).click();
        await until(async () => (await page.locator(
            'article.assistant[data-status="completed"]').count()) === 2,
                    'the second answer');
        assert.equal((await stored(stack, cid)).messages
            .filter((m) => m.role === 'user').length, 2);
        assert.deepEqual(seen, { dialogs: [], errors: [], csp: [] });
        await context.close();
    });

    test('the cost shown is the run\'s usage', async () => {
        const { page, context } = await openPage(browser, stack);
        await sendMessage(page, 'stream please');
        await answer(page).and(page.locator('[data-status="completed"]'))
            .waitFor();
        const cid = await conversationId(page);
        const conv = await stored(stack, cid);
        const runId = conv.messages.find((m) => m.role === 'assistant').run_id;
        const run = (await stack.get(`/v1/runs/${runId}`)).body;
        const micros = run.usage.cost_micros;
        assert.ok(Number.isInteger(micros) && micros > 0, JSON.stringify(run));
        assert.equal(await answer(page).getAttribute('data-cost-micros'),
                     String(micros));
        const meta = await answer(page).locator('.meta-text').innerText();
        assert.ok(meta.includes(`$${(micros / 1e6).toFixed(6)}`), meta);
        assert.ok(meta.includes(`${run.usage.prompt_tokens} in`), meta);
        assert.ok(meta.includes(`${run.usage.completion_tokens} out`), meta);
        assert.ok(meta.includes('fake/m'), meta);
        assert.equal(await page.locator('#totals').getAttribute(
            'data-cost-micros'), String(micros));

        /* The same numbers once the conversation is opened again. */
        await page.reload();
        await answer(page).and(page.locator('[data-status="completed"]'))
            .waitFor();
        assert.equal(await answer(page).getAttribute('data-cost-micros'),
                     String(micros));
        await context.close();
    });

    test('Stop cancels the run upstream and keeps the partial answer',
         async () => {
        const { page, context, seen } = await openPage(browser, stack);
        await sendMessage(page, 'hang please');
        await answer(page).getByText('partial answer').waitFor();
        const stop = page.getByRole('button', { name: 'Stop' });
        assert.ok(await stop.isEnabled());
        assert.equal((await fakeStats(stack)).hanging, 1);
        await stop.click();
        await answer(page).and(page.locator('[data-status="cancelled"]'))
            .waitFor();
        assert.equal(await answer(page).locator('.status').innerText(),
                     'Stopped');
        assert.match(await answer(page).locator('.flow').innerText(),
                     /partial answer/);
        /* The upstream request was aborted: the fake saw its client go. */
        await until(async () => (await fakeStats(stack)).hanging === 0,
                    'the fake to see the connection closed');
        const cid = await conversationId(page);
        const a = (await stored(stack, cid)).messages
            .find((m) => m.role === 'assistant');
        assert.equal(a.status, 'cancelled');
        assert.match(a.content, /partial answer/);
        assert.ok(await page.getByRole('button', { name: 'Send' }).isEnabled());
        await shot(page, 'stopped');

        /* Opened again, it still says so. */
        await page.reload();
        await answer(page).and(page.locator('[data-status="cancelled"]'))
            .waitFor();
        assert.deepEqual(seen.dialogs, []);
        await context.close();
    });

    test('a reload mid-answer reattaches and the answer finishes', async () => {
        const { page, context } = await openPage(browser, stack);
        await sendMessage(page, 'slow please');
        await answer(page).getByText('w1', { exact: false }).waitFor();
        const cid = await conversationId(page);
        await page.reload();
        await answer(page).and(page.locator('[data-status="completed"]'))
            .waitFor();
        const text = await answer(page).locator('.flow').innerText();
        assert.equal(text.trim(), slow.join('').trim());
        assert.equal(await page.locator('article.user').count(), 1);
        assert.equal(await page.locator('article.user').innerText(),
                     'slow please');
        /* One model call: the page followed the run, it did not rerun. */
        const calls = stack.fakeRequests('fake').filter((r) =>
            JSON.stringify(r.body.messages).includes('slow please') &&
            !JSON.stringify(r.body.messages).includes(TITLE));
        assert.equal(calls.length, 1);
        assert.equal(await page.evaluate(() => localStorage.getItem(
            'loom.pending')), '{}');
        assert.equal((await stored(stack, cid)).messages.length, 2);
        await context.close();
    });

    test('a tool card waits for approval, then runs and is done', async () => {
        const { page, context, seen } = await openPage(browser, stack);
        await page.getByLabel('Agent or model').selectOption('agent/careful');
        await sendMessage(page, 'tool please');
        const card = page.locator('details.tool[data-tool="get_time"]');
        await card.and(page.locator('[data-status="waiting"]')).waitFor();
        const form = page.getByRole('form', { name: 'Approve get_time' });
        await form.waitFor();
        await shot(page, 'approval');
        await form.getByRole('button', { name: 'Approve' }).click();
        await card.and(page.locator('[data-status="done"]')).waitFor();
        await answer(page).and(page.locator('[data-status="completed"]'))
            .waitFor();
        assert.match(await answer(page).locator('.flow').innerText(),
                     /The time is known\./);
        await card.locator('summary').click();
        assert.match(await card.locator('.args').innerText(), /"UTC"/);
        assert.ok((await card.locator('.output').innerText()).length > 0);
        assert.match(await card.locator('.duration').innerText(), /\d+ ms/);
        assert.match(await answer(page).locator('.meta-text').innerText(),
                     /agent careful/);
        await shot(page, 'tool');
        assert.deepEqual(seen, { dialogs: [], errors: [], csp: [] });

        /* axe-core on a page with a conversation, a tool card, a form. */
        assert.deepEqual(await axeCritical(page), []);
        await context.close();
    });

    test('a denied call fails with the reason; the run goes on', async () => {
        const { page, context } = await openPage(browser, stack);
        await page.getByLabel('Agent or model').selectOption('agent/careful');
        await sendMessage(page, 'deny please');
        const form = page.getByRole('form', { name: 'Approve get_time' });
        await form.getByRole('textbox', { name: 'Reason' })
            .fill('not today');
        await form.getByRole('button', { name: 'Deny' }).click();
        await answer(page).and(page.locator('[data-status="completed"]'))
            .waitFor();
        const card = page.locator('details.tool[data-tool="get_time"]');
        assert.equal(await card.getAttribute('data-status'), 'failed');
        await card.locator('summary').click();
        assert.match(await card.locator('.output').innerText(), /not today/);
        assert.equal(await form.getByRole('status').innerText(), 'Denied');
        assert.match(await answer(page).locator('.flow').innerText(),
                     /Understood\./);
        await context.close();
    });

    test('the keyboard alone reaches every control and sends', async () => {
        const { page, context } = await openPage(browser, stack);
        await page.getByRole('textbox', { name: 'Message' }).waitFor();
        const names = new Set();
        for (let i = 0; i < 200 && !names.has('Message'); i++) {
            await page.keyboard.press('Tab');
            names.add(await page.evaluate(() => {
                const e = document.activeElement;
                return e.getAttribute('aria-label') ||
                    (e.labels && e.labels[0] && e.labels[0].textContent.trim()) ||
                    e.textContent.trim();
            }));
        }
        for (const n of ['New chat', 'Search conversations', 'Agent or model',
                         'Message'])
            assert.ok(names.has(n), `${n} not reached: ${[...names]}`);
        await page.keyboard.type('code please');
        await page.keyboard.press('Enter');
        await answer(page).and(page.locator('[data-status="completed"]'))
            .waitFor();
        /* The code block came highlighted (a known language). */
        const code = answer(page).locator('pre code.hljs.language-js');
        assert.equal(await code.locator('.hljs-keyword').first().innerText(),
                     'const');
        await context.close();
    });

    test('reasoning, the plan and a sub-agent nested in its call', async () => {
        const { page, context, seen } = await openPage(browser, stack);
        await page.getByLabel('Agent or model').selectOption('agent/boss');
        await sendMessage(page, 'structure please');
        await answer(page).and(page.locator('[data-status="completed"]'))
            .waitFor();
        const a = answer(page);
        const reasoning = a.locator('details.reasoning');
        assert.equal(await reasoning.getAttribute('open'), null);
        await reasoning.locator('summary').click();
        assert.equal(await reasoning.locator('.body').innerText(),
                     'Let me plan.');
        const task = a.getByRole('region', { name: 'Plan' }).locator('li');
        assert.match(await task.innerText(), /in_progress\s*Ask the helper/);
        const call = a.locator('details.tool[data-tool="helper"]');
        assert.equal(await call.getAttribute('data-status'), 'done');
        await call.locator('summary').first().click();
        const sub = call.getByRole('region', { name: 'Sub-agent helper' });
        assert.equal(await sub.locator('.sub-head .badge').innerText(), 'done');
        const inner = sub.locator('details.tool[data-tool="get_time"]');
        assert.equal(await inner.getAttribute('data-status'), 'done');
        assert.match(await sub.locator('.text').innerText(),
                     /helper says noon/);
        assert.match(await a.locator('.flow > .text').last().innerText(),
                     /All done\./);
        await shot(page, 'structure');
        assert.deepEqual(seen, { dialogs: [], errors: [], csp: [] });
        await context.close();
    });

    test('deep research: plan, cycles, researchers, a failed one, report',
         async () => {
        const { page, context, seen } = await openPage(browser, stack);
        await page.getByRole('checkbox', { name: 'Deep research' }).check();
        await sendMessage(page, 'research please');
        await answer(page).and(page.locator('[data-status="completed"]'))
            .waitFor();
        const a = answer(page);
        const plan = a.locator('details.plan-text');
        await plan.locator('summary').click();
        assert.equal(await plan.locator('.body').innerText(),
                     '1. alpha\n2. beta');
        assert.match(await a.locator('.research-cycle').first().innerText(),
                     /Research cycle 1 of 8/);
        const ok = a.locator('details.researcher', { hasText: 'alpha topic' });
        const bad = a.locator('details.researcher', { hasText: 'beta topic' });
        assert.equal(await ok.getAttribute('data-status'), 'done');
        assert.equal(await bad.getAttribute('data-status'), 'failed');
        await bad.locator('summary').first().click();
        assert.match(await bad.locator('.output').innerText(), /beta broke/);
        assert.equal(await a.locator('.flow > .text strong').innerText(),
                     'true');
        const summary = a.getByRole('region', { name: 'Research',
                                                 exact: true });
        assert.match(await summary.innerText(), /2 researchers, 1 failed/);
        await shot(page, 'research');

        const [download] = await Promise.all([
            page.waitForEvent('download'),
            summary.getByRole('button', { name: 'Download report' }).click(),
        ]);
        const saved = fs.readFileSync(await download.path(), 'utf8');
        const cid = await conversationId(page);
        const runId = (await stored(stack, cid)).messages
            .find((m) => m.role === 'assistant').run_id;
        const report = await fetch(`${stack.baseURL}/v1/runs/${runId}/report`);
        assert.equal(report.status, 200);
        assert.equal(saved, await report.text());
        assert.match(saved, /Alpha is \*\*true\*\*/);
        assert.deepEqual(seen, { dialogs: [], errors: [], csp: [] });
        await context.close();
    });

    test('model output, tool output and titles run no script', async () => {
        const { page, context, seen } = await openPage(browser, stack);
        await sendMessage(page, 'xss please');
        await answer(page).and(page.locator('[data-status="completed"]'))
            .waitFor();
        const flow = await answer(page).locator('.flow').innerText();
        assert.ok(flow.includes(XSS_IMG), flow);
        assert.ok(flow.includes('<script>alert(2)</script>'), flow);
        const link = answer(page).getByRole('link', { name: 'a link' });
        assert.equal(await link.getAttribute('rel'), 'noopener noreferrer');
        assert.equal(await link.getAttribute('target'), '_blank');
        const cid = await conversationId(page);
        const item = page.locator(`#conversations li[data-id="${cid}"]`);
        await item.getByText(`${XSS_IMG} title`).waitFor();
        assert.ok((await page.locator('#chat-title').innerText())
            .includes(XSS_IMG));

        await page.getByRole('button', { name: 'New chat' }).click();
        await sendMessage(page, 'hostile tool output');
        await answer(page).and(page.locator('[data-status="completed"]'))
            .waitFor();
        const card = answer(page).locator('details.tool');
        await card.locator('summary').click();
        assert.ok((await card.locator('.args').innerText()).includes(XSS_TOOL));
        assert.ok((await card.locator('.output').innerText())
            .includes('<img src=x onerror=alert(3)>'));
        await shot(page, 'xss');

        assert.equal(await page.locator('#log img, #log script, ' +
                                        '#conversations img').count(), 0);
        assert.deepEqual(seen, { dialogs: [], errors: [], csp: [] });
        await context.close();
    });

    test('editing a message resends it as a branch; arrows switch', async () => {
        const { page, context, seen } = await openPage(browser, stack);
        await sendMessage(page, 'fruit: apples?');
        await answer(page).and(page.locator('[data-status="completed"]'))
            .waitFor();
        const root = await conversationId(page);
        await page.getByRole('button', { name: 'Edit message' }).click();
        const box = page.getByRole('textbox', { name: 'Edited message' });
        assert.equal(await box.inputValue(), 'fruit: apples?');
        await box.fill('fruit: pears?');
        await page.getByRole('button', { name: 'Save edit' }).click();
        await answer(page).getByText('Pears are green.').waitFor();
        await answer(page).and(page.locator('[data-status="completed"]'))
            .waitFor();
        const branch = await conversationId(page);
        assert.notEqual(branch, root);
        assert.equal(await page.locator('article.user').count(), 1);
        assert.equal(await page.locator('article.user').innerText(),
                     'fruit: pears?');
        const versions = page.getByRole('group',
                                        { name: 'Versions of this message' });
        await versions.getByText('2 / 2').waitFor();
        await shot(page, 'branches');

        /* Stored as two conversations; the original is untouched and
         * the branch is no second item of the sidebar. */
        const b = await stored(stack, branch);
        assert.equal(b.parent_id, root);
        assert.deepEqual(b.messages.filter((m) => m.role === 'user')
            .map((m) => m.content), ['fruit: pears?']);
        const r = await stored(stack, root);
        assert.deepEqual(r.messages.map((m) => m.content),
                         ['fruit: apples?', 'Apples are red.']);
        await page.locator(`#conversations li[data-id="${root}"]`).waitFor();
        assert.equal(await page.locator(
            `#conversations li[data-id="${branch}"]`).count(), 0);

        /* The arrows move between the two versions. */
        assert.ok(await versions.getByRole('button', { name: 'Next version' })
            .isDisabled());
        await versions.getByRole('button', { name: 'Previous version' })
            .click();
        await answer(page).getByText('Apples are red.').waitFor();
        await versions.getByText('1 / 2').waitFor();
        assert.equal(await conversationId(page), root);
        assert.equal(await page.locator('article.user').innerText(),
                     'fruit: apples?');
        await versions.getByRole('button', { name: 'Next version' }).click();
        await answer(page).getByText('Pears are green.').waitFor();
        await versions.getByText('2 / 2').waitFor();
        assert.equal(await conversationId(page), branch);
        assert.deepEqual(seen, { dialogs: [], errors: [], csp: [] });
        await context.close();
    });

    test('the sidebar renames, searches and deletes conversations', async () => {
        const { page, context } = await openPage(browser, stack);
        await sendMessage(page, 'stream please');
        await answer(page).and(page.locator('[data-status="completed"]'))
            .waitFor();
        const cid = await conversationId(page);
        const item = page.locator(`#conversations li[data-id="${cid}"]`);
        await item.getByText('Friendly greeting').waitFor();
        await item.getByRole('button', { name: /^Rename/ }).click();
        const input = item.getByRole('textbox', { name: 'New title' });
        await input.waitFor();
        /* The list reloads (here for a search; also when a run ends)
         * while a title is being edited: the edit stays. */
        const reloaded = page.waitForResponse(
            (r) => r.url().includes('/v1/conversations?'));
        await page.getByRole('searchbox', { name: 'Search conversations' })
            .fill('friendly');
        await reloaded;
        await input.fill('Zebra facts');
        await input.press('Enter');
        await item.getByText('Zebra facts').waitFor();
        assert.equal((await stored(stack, cid)).title, 'Zebra facts');

        await page.getByRole('searchbox', { name: 'Search conversations' })
            .fill('zebra');
        await until(async () => (await page.locator('#conversations li')
            .count()) === 1, 'the search to keep one conversation');
        await shot(page, 'sidebar');

        page.acceptConfirm = true;
        await item.getByRole('button', { name: 'Delete Zebra facts' }).click();
        await until(async () => (await page.locator('#conversations li')
            .count()) === 0, 'the conversation to go');
        assert.equal((await stack.get(`/v1/conversations/${cid}`)).status, 404);
        assert.equal(await page.locator('#chat-title').innerText(), 'New chat');
        await context.close();
    });
});

/* The form loom-fake-mcp asks for (its elicit tool's x argument). */
const XSS_FORM = '<img src=x onerror=alert(5)>';
const FORM = {
    message: `Tell us about you ${XSS_FORM}`,
    requestedSchema: {
        type: 'object',
        properties: {
            name: { type: 'string', title: 'Your name', minLength: 1,
                    description: 'as you like to be called' },
            age: { type: 'integer', title: 'Age', minimum: 0 },
            subscribe: { type: 'boolean', title: 'Subscribe' },
            colour: { type: 'string', title: 'Colour', enum: ['red', 'green'],
                      enumNames: ['Red', 'Green'] },
        },
        required: ['name', 'colour'],
    },
};
const elicit = { tool_calls: [{ id: 'call_f1', name: 'fake__elicit',
                                 arguments: JSON.stringify(
                                     { x: JSON.stringify(FORM) }) }] };

const formScript = {
    rules: [
        { match: { system: TITLE }, loop: true,
          responses: [textResponse(['Form chat'])] },
        { match: { first_user: 'form please' },
          responses: [elicit, textResponse(['Thanks for the form.'])] },
        { match: { first_user: 'decline please' },
          responses: [elicit, textResponse(['No form then.'])] },
    ],
};

describe('web UI forms', () => {
    const env = {};
    useStack(env, {
        fakes: { fake: formScript },
        models,
        agents: { asker: { model: 'fake/m', tools: ['fake__elicit'] } },
        mcp: { fake: { command: path.join(path.dirname(LOOM_BIN),
                                          'loom-fake-mcp'),
                       args: ['form'] } },
    });
    let stack;
    let browser;
    before(() => ({ stack, browser } = env));

    /* The output of the answer's fake__elicit card. */
    async function cardOutput(page) {
        const card = answer(page).locator('details.tool[data-tool=' +
                                          '"fake__elicit"]');
        await card.and(page.locator('[data-status="done"]')).waitFor();
        await card.locator('summary').click();
        return card.locator('.output').innerText();
    }

    test('an MCP server\'s form, filled in after a reload', async () => {
        const { page, context, seen } = await openPage(browser, stack);
        await page.getByLabel('Agent or model').selectOption('agent/asker');
        await sendMessage(page, 'form please');
        let form = page.getByRole('form', { name: 'Form from fake' });
        await form.waitFor();
        const card = answer(page).locator('details.tool');
        assert.equal(await card.getAttribute('data-status'), 'waiting');

        /* The run goes on with the tab gone; the page asks again. */
        await page.reload();
        form = page.getByRole('form', { name: 'Form from fake' });
        await form.waitFor();
        assert.ok((await form.locator('.message').innerText())
            .includes(`Tell us about you ${XSS_FORM}`));
        const name = form.getByRole('textbox', { name: /^Your name/ });
        const help = await name.getAttribute('aria-describedby');
        assert.equal(await form.locator(`#${help}`).innerText(),
                     'as you like to be called');
        await form.getByRole('spinbutton', { name: 'Age' }).fill('41');
        await form.getByRole('checkbox', { name: 'Subscribe' }).check();
        await form.getByRole('combobox', { name: /^Colour/ })
            .selectOption('Green');
        await shot(page, 'form');

        /* A required field left empty: the browser keeps the form. */
        await form.getByRole('button', { name: 'Submit' }).click();
        assert.equal(await form.getByRole('status').innerText(), '');
        await name.fill('Ada');
        await form.getByRole('button', { name: 'Submit' }).click();
        await answer(page).and(page.locator('[data-status="completed"]'))
            .waitFor();
        assert.equal(await form.getByRole('status').innerText(), 'Sent');
        assert.ok(await form.getByRole('button', { name: 'Submit' })
            .isDisabled());
        assert.equal(await cardOutput(page),
                     '{"action":"accept","content":{"age":41,"colour":' +
                     '"green","name":"Ada","subscribe":true}}');
        assert.match(await answer(page).locator('.flow').innerText(),
                     /Thanks for the form\./);
        assert.equal(await page.locator('#log img').count(), 0);

        assert.deepEqual(await axeCritical(page), []);
        assert.deepEqual(seen, { dialogs: [], errors: [], csp: [] });
        await context.close();
    });

    test('a declined form: the call hears decline', async () => {
        const { page, context } = await openPage(browser, stack);
        await page.getByLabel('Agent or model').selectOption('agent/asker');
        await sendMessage(page, 'decline please');
        const form = page.getByRole('form', { name: 'Form from fake' });
        await form.getByRole('button', { name: 'Decline' }).click();
        await answer(page).and(page.locator('[data-status="completed"]'))
            .waitFor();
        assert.equal(await form.getByRole('status').innerText(), 'Declined');
        assert.equal(await cardOutput(page), '{"action":"decline"}');
        await context.close();
    });
});

/*
 * A web server on 127.0.0.1 standing in for the web: SearXNG's /search
 * (two results, pages of its own) and the pages themselves.
 */
async function startWeb() {
    const server = http.createServer((req, res) => {
        const url = new URL(req.url, 'http://x');
        if (url.pathname === '/search') {
            res.writeHead(200, { 'Content-Type': 'application/json' });
            res.end(JSON.stringify({ results: ['gamma', 'delta'].map((n) => ({
                url: `${server.base}/${n}.html`, title: `About ${n}`,
                content: `Facts on ${n}.` })) }));
        } else if (/^\/(gamma|delta)\.html$/.test(url.pathname)) {
            res.writeHead(200, { 'Content-Type': 'text/html' });
            res.end(`<!doctype html><title>Page ${url.pathname}</title>`);
        } else {
            res.writeHead(404).end();
        }
    });
    await new Promise((r) => server.listen(0, '127.0.0.1', r));
    server.base = `http://127.0.0.1:${server.address().port}`;
    return server;
}

const search = (id, query) => ({ tool_calls: [{
    id, name: 'web_search', arguments: JSON.stringify({ query }) }] });

const webScript = {
    rules: [
        { match: { system: TITLE }, loop: true,
          responses: [textResponse(['Web chat'])] },
        { match: { first_user: 'cite please' },
          responses: [search('w1', 'gamma'),
                      textResponse(['Gamma holds [1], delta too [2].'])] },
        /* A deep research run that asks first, then researches. */
        { match: { first_user: 'gamma topic' },
          responses: [search('g1', 'gamma'),
                      textResponse(['Gamma is so [1].'])] },
        { match: { first_user: 'clarify please',
                   system: 'Write the final report' },
          responses: [textResponse(['Gamma is **known**.'])] },
        { match: { first_user: 'clarify please', system: 'Research cycle',
                   tools_include: ['research_agent'] },
          responses: [
              { tool_calls: [{ id: 'rg1', name: 'research_agent',
                               arguments: '{"task":"gamma topic"}' }] },
              { tool_calls: [{ id: 'rg2', name: 'generate_report',
                               arguments: '{}' }] }] },
        { match: { first_user: 'clarify please',
                   system: 'Write the research plan' },
          responses: [textResponse(['1. gamma'])] },
        { match: { first_user: 'clarify please',
                   system: 'Before any research starts' },
          responses: [textResponse(['Which gamma do you mean?'])] },
    ],
};

describe('web UI: questions, citations and sources', () => {
    let web;
    let stack;
    let browser;
    before(async () => {
        web = await startWeb();
        stack = await Stack.start({
            fakes: { fake: webScript },
            models,
            agents: { cite: { model: 'fake/m', citations: true,
                              tools: ['web_search'] } },
            tools: { web_search: { backend: 'searxng', base_url: web.base } },
        });
        browser = await launch();
    });
    after(() => teardown([browser && (() => browser.close()),
                          stack && (() => stack.close()),
                          web && (() => closeServer(web))]));

    test('citations are numbered links that open the source', async () => {
        const { page, context, seen } = await openPage(browser, stack);
        await page.getByLabel('Agent or model').selectOption('agent/cite');
        await sendMessage(page, 'cite please');
        await answer(page).and(page.locator('[data-status="completed"]'))
            .waitFor();
        const items = answer(page).locator('ol.citations li');
        assert.equal(await items.count(), 2);
        assert.deepEqual(await items.evaluateAll((lis) => lis.map(
            (li) => li.value)), [1, 2]);
        const link = items.first().getByRole('link', { name: 'About gamma' });
        assert.equal(await link.getAttribute('href'), `${web.base}/gamma.html`);
        assert.equal(await link.getAttribute('rel'), 'noopener noreferrer');
        assert.equal(await link.getAttribute('target'), '_blank');
        await shot(page, 'citations');
        const [popup] = await Promise.all([page.waitForEvent('popup'),
                                           link.click()]);
        await popup.waitForLoadState();
        assert.equal(popup.url(), `${web.base}/gamma.html`);
        assert.equal(await popup.title(), 'Page /gamma.html');
        /* noopener: the source cannot reach the page that opened it. */
        assert.equal(await popup.evaluate(() => window.opener), null);
        await popup.close();
        assert.deepEqual(seen, { dialogs: [], errors: [], csp: [] });
        await context.close();
    });

    test('research asks a question; the next message answers it; each ' +
         'researcher shows its sources', async () => {
        const { page, context, seen } = await openPage(browser, stack);
        await page.getByRole('checkbox', { name: 'Deep research' }).check();
        await sendMessage(page, 'clarify please');
        const first = answer(page);
        await first.and(page.locator('[data-status="needs_input"]')).waitFor();
        assert.equal((await first.locator('.flow').innerText()).trim(),
                     'Which gamma do you mean?');
        assert.match(await first.locator('.status').innerText(),
                     /next message answers the question/);
        await shot(page, 'clarify');

        /* The reply goes to the research run, the toggle off or not. */
        await page.getByRole('checkbox', { name: 'Deep research' }).uncheck();
        await sendMessage(page, 'the greek letter');
        await until(async () => (await page.locator(
            'article.assistant[data-status="completed"]').count()) === 1,
                    'the report');
        const a = answer(page);
        assert.equal(await a.locator('.flow > .text strong').innerText(),
                     'known');
        const researcher = a.locator('details.researcher',
                                     { hasText: 'gamma topic' });
        assert.equal(await researcher.getAttribute('data-status'), 'done');
        assert.equal(await researcher.getAttribute('data-sources'), '2');
        assert.equal(await researcher.locator('.sources').innerText(),
                     '2 sources');
        const cid = await conversationId(page);
        const msgs = (await stored(stack, cid)).messages;
        assert.deepEqual(msgs.filter((m) => m.role === 'user')
            .map((m) => m.content), ['clarify please', 'the greek letter']);
        assert.deepEqual(seen, { dialogs: [], errors: [], csp: [] });
        await context.close();
    });
});

describe('web UI with accounts on', () => {
    const env = {};
    useStack(env, { fakes: { fake: script }, models, auth: { mode: 'keys' } });
    let stack;
    let browser;
    let alice;
    let bob;

    const newKey = (...args) => {
        const out = stack.keys('create', ...args).trim().split('\n');
        return out[out.length - 1];
    };

    before(() => {
        ({ stack, browser } = env);
        alice = newKey('--user', 'alice', '--workspace', 'acme');
        bob = newKey('--user', 'bob', '--workspace', 'acme');
    });

    test('sign in with a key; each user sees only their own', async () => {
        const { page, context, seen } = await openPage(browser, stack);
        const key = page.getByLabel('API key');
        await key.waitFor();
        assert.ok(await page.locator('#app').isHidden());
        await page.evaluate(AXE);
        const res = await page.evaluate(() => window.axe.run());
        assert.deepEqual(res.violations.filter((v) => v.impact === 'critical')
            .map((v) => v.id), []);
        await shot(page, 'signin');

        await key.fill('lk_0000000000000000_nope');
        await page.getByRole('button', { name: 'Sign in' }).click();
        await page.getByText('That key was not accepted.').waitFor();

        await key.fill(alice);
        await page.getByRole('button', { name: 'Sign in' }).click();
        await page.getByRole('textbox', { name: 'Message' }).waitFor();
        await sendMessage(page, 'stream please');
        await answer(page).and(page.locator('[data-status="completed"]'))
            .waitFor();
        const cid = await conversationId(page);
        await page.locator(`#conversations li[data-id="${cid}"]`).waitFor();

        /* Bob, in another browser profile, sees nothing of Alice's. */
        const b = await openPage(browser, stack, { key: bob });
        await b.page.getByRole('textbox', { name: 'Message' }).waitFor();
        await b.page.getByRole('navigation', { name: 'Conversations' })
            .waitFor();
        await until(async () => (await b.page.evaluate(() =>
            document.querySelector('#app').hidden)) === false, 'the app');
        assert.equal(await b.page.locator('#conversations li').count(), 0);
        await b.page.goto(`${stack.baseURL}/#c=${cid}`);
        await b.page.getByRole('alert').filter({ hasText: /not found/ })
            .waitFor();
        assert.equal(await b.page.locator('article').count(), 0);
        await b.context.close();

        /* Signing out forgets the key. */
        await page.getByRole('button', { name: 'Sign out' }).click();
        await page.getByLabel('API key').waitFor();
        assert.equal(await page.evaluate(() => localStorage.getItem(
            'loom.key')), null);
        assert.deepEqual(seen, { dialogs: [], errors: [], csp: [] });
        await context.close();
    });
});

describe('web UI turned off', () => {
    test('server.ui: false answers 404 at / and keeps the API', async () => {
        const stack = await Stack.start({ fakes: { fake: script },
                                          server: { ui: 'false' } });
        try {
            assert.equal((await fetch(`${stack.baseURL}/`)).status, 404);
            assert.equal((await fetch(`${stack.baseURL}/assets/app.js`))
                .status, 404);
            assert.equal((await stack.get('/v1/models')).status, 200);
        } finally {
            await stack.close();
        }
    });
});


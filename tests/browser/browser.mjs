/*
 * browser.mjs: what the browser tests of the web UI (docs/ui.md) share.
 * Chromium is Debian's (`apt-get install chromium`; $LOOM_CHROMIUM names
 * another), driven headless by playwright-core; `loom serve` and the fake
 * upstream come from tests/e2e/harness.mjs.
 *
 * openPage() gives a page that records every dialog (alert, confirm, ...:
 * dismissed at once; a test that means to accept the next confirm() sets
 * page.acceptConfirm), uncaught page error and Content-Security-Policy
 * violation, so a test can assert that untrusted text ran nothing.
 * shot() saves a screenshot as a test artefact under $LOOM_UI_SHOTS
 * (scripts/e2e.sh sets <build>/ui-screenshots), else build/ui-screenshots.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..', '..');

export const SHOTS = process.env.LOOM_UI_SHOTS ||
    path.join(repo, 'build', 'ui-screenshots');

/* How long a test waits for the page to show something. */
export const WAIT_MS = 20000;

function chromiumPath() {
    if (process.env.LOOM_CHROMIUM)
        return process.env.LOOM_CHROMIUM;
    for (const p of ['/usr/bin/chromium', '/usr/bin/chromium-browser'])
        if (fs.existsSync(p))
            return p;
    throw new Error('Chromium not found: apt-get install chromium ' +
                    '(or set LOOM_CHROMIUM)');
}

export async function launch() {
    const args = ['--disable-dev-shm-usage'];
    if (process.getuid && process.getuid() === 0)
        args.push('--no-sandbox');
    return chromium.launch({ executablePath: chromiumPath(), headless: true,
                             args });
}

/*
 * A new page (in a context of its own: its own localStorage) on the
 * stack's UI. key: an API key put in localStorage first (signed in).
 */
export async function openPage(browser, stack, { key, hash = '' } = {}) {
    const context = await browser.newContext({
        viewport: { width: 1200, height: 800 },
    });
    context.setDefaultTimeout(WAIT_MS);
    const page = await context.newPage();
    const seen = { dialogs: [], errors: [], csp: [] };
    page.on('dialog', (d) => {
        if (page.acceptConfirm && d.type() === 'confirm') {
            page.acceptConfirm = false;
            d.accept().catch(() => {});
            return;
        }
        seen.dialogs.push(`${d.type()}: ${d.message()}`);
        d.dismiss().catch(() => {});
    });
    page.on('pageerror', (e) => seen.errors.push(e.message));
    page.on('console', (m) => {
        if (m.type() === 'error' && /Content Security Policy/.test(m.text()))
            seen.csp.push(m.text());
    });
    if (key)
        await page.addInitScript((k) => {
            if (!localStorage.getItem('loom.key'))
                localStorage.setItem('loom.key', k);
        }, key);
    await page.goto(`${stack.baseURL}/${hash}`);
    return { page, context, seen };
}

export async function shot(page, name) {
    fs.mkdirSync(SHOTS, { recursive: true });
    await page.screenshot({ path: path.join(SHOTS, `${name}.png`) });
}

/* Sends text from the message box with Enter. */
export async function sendMessage(page, text) {
    const box = page.getByRole('textbox', { name: 'Message' });
    await box.fill(text);
    await box.press('Enter');
}

/* The conversation id the page shows (its address: #c=<id>). */
export async function conversationId(page) {
    await page.waitForFunction(() => /^#c=/.test(location.hash));
    return page.evaluate(() => decodeURIComponent(location.hash.slice(3)));
}

/* Resolves when fn() is truthy, polling every 50 ms for up to WAIT_MS. */
export async function until(fn, what) {
    const end = Date.now() + WAIT_MS;
    for (;;) {
        const v = await fn();
        if (v)
            return v;
        if (Date.now() > end)
            throw new Error(`timed out waiting for ${what}`);
        await new Promise((r) => setTimeout(r, 50));
    }
}

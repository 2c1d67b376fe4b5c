/*
 * The tokenizer against js-tiktoken: `loom tokens` must give the very same
 * ids as js-tiktoken (npm) for o200k_base and cl100k_base over a generated
 * corpus of more than 10 MB (corpus.mjs: prose in many scripts, code,
 * JSON, emoji, digit and whitespace runs, special-token text, random code
 * points, invalid UTF-8), and its count-only path the same count.
 *
 * Invalid UTF-8: a JavaScript tokenizer only sees strings, so loom's ids
 * for raw bytes are compared with js-tiktoken's for the string a WHATWG
 * TextDecoder makes of them (U+FFFD per maximal invalid subpart), which is
 * what loom reads too. Lone surrogates, which only a JS string can hold,
 * are checked apart: js-tiktoken gives a lone surrogate the ids of U+FFFD
 * (its TextEncoder writes that, and both are "other" to the pattern), so
 * loom's ids for the string's UTF-8 (where Buffer.from put U+FFFD) must
 * equal js-tiktoken's for the string itself.
 *
 * js-tiktoken is slow (about 1 MB/s), so each encoding runs on its own
 * worker thread while the loom processes run beside them, and its ids
 * are kept in node_modules/.cache/loom-tiktoken, keyed by everything that
 * decides them (corpus-worker.mjs), for the next run; `npm ci` empties
 * it, LOOM_TIKTOKEN_CACHE=0 bypasses it. Needs the vocabularies
 * (scripts/vocab.sh).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { getEncoding } from 'js-tiktoken';
import { generateCorpus } from './corpus.mjs';
import { LOOM_BIN } from './harness.mjs';

const ENCODINGS = ['o200k_base', 'cl100k_base'];
const CACHE = process.env.LOOM_TIKTOKEN_CACHE === '0' ? null :
    fileURLToPath(new URL('./node_modules/.cache/loom-tiktoken',
                          import.meta.url));
const MIN_BYTES = 10.5e6;
const TIMEOUT_MS = 240000;

/* js-tiktoken's ids for bytes, on a worker thread. */
function jsIds(encoding, bytes, allowSpecial = false) {
    return new Promise((resolve, reject) => {
        const w = new Worker(new URL('./corpus-worker.mjs', import.meta.url),
                             { workerData: { encoding, bytes, allowSpecial,
                                             cache: CACHE } });
        w.once('message', resolve);
        w.once('error', reject);
        w.once('exit', (code) => {
            if (code !== 0)
                reject(new Error(`js-tiktoken worker exited ${code}`));
        });
    });
}

/* The vocabularies of this source tree, wherever the build is. */
const ENV = {
    ...process.env,
    LOOM_VOCAB_DIR: process.env.LOOM_VOCAB_DIR ||
        fileURLToPath(new URL('../../vocab/data', import.meta.url)),
};

/* Runs `loom tokens ARGS`; resolves to its stdout. */
function loom(args) {
    return new Promise((resolve, reject) => {
        execFile(LOOM_BIN, ['tokens', ...args],
                 { maxBuffer: 1 << 30, encoding: 'utf8', env: ENV },
                 (err, stdout, stderr) => {
                     if (err)
                         reject(new Error(`loom tokens ${args.join(' ')}: ` +
                                          `${err.message}\n${stderr}`));
                     else
                         resolve({ stdout, stderr });
                 });
    });
}

/* `loom tokens --ids`: the ids line, then the count line. */
async function loomIds(encoding, file, extra = []) {
    const { stdout } = await loom(['--ids', '--encoding', encoding, ...extra,
                                   file]);
    const [idsLine, countLine] = stdout.split('\n');
    const ids = idsLine === '' ? [] : idsLine.split(' ').map(Number);
    assert.equal(Number(countLine), ids.length, 'count line = ids');
    return ids;
}

async function loomCount(args) {
    const { stdout } = await loom(args);
    return Number(stdout.trim());
}

/* Fails with where the first difference is, in text. */
function assertSameIds(got, want, what, enc) {
    if (got.length === want.length && got.every((v, i) => v === want[i]))
        return;
    let i = 0;
    while (i < got.length && i < want.length && got[i] === want[i])
        i++;
    const e = getEncoding(enc);
    const show = (ids) => JSON.stringify(e.decode(
        Array.from(ids.slice(Math.max(0, i - 4), i + 6))));
    assert.fail(`${what}: ids differ at ${i} of ${want.length} ` +
                `(loom has ${got.length}):\n  js-tiktoken ${show(want)} ` +
                `${Array.from(want.slice(i, i + 6))}\n  loom        ` +
                `${show(got)} ${Array.from(got.slice(i, i + 6))}`);
}

describe('tokenizer: loom tokens against js-tiktoken', () => {
    let dir;
    const files = {};
    const jobs = {};
    let surrogateText = '';

    before(() => {
        dir = fs.mkdtempSync(path.join(os.tmpdir(), 'loom-tiktoken-'));
        const { docs, total } = generateCorpus();
        assert.ok(total >= MIN_BYTES, `corpus of ${total} bytes`);
        files.corpus = path.join(dir, 'corpus.bin');
        const corpus = Buffer.concat(docs.map((d) => d.bytes));
        fs.writeFileSync(files.corpus, corpus);
        /* special-token text, read as special tokens */
        const specials = docs.filter((d) => d.kind === 'specials')
            .map((d) => d.bytes);
        files.specials = path.join(dir, 'specials.txt');
        const specialBytes = Buffer.concat(specials);
        fs.writeFileSync(files.specials, specialBytes);
        surrogateText = docs.filter((d) => d.kind === 'surrogates')
            .map((d) => d.text).join('');
        files.surrogates = path.join(dir, 'surrogates.txt');
        fs.writeFileSync(files.surrogates, Buffer.from(surrogateText, 'utf8'));
        /* start everything at once; the tests wait for their part */
        for (const enc of ENCODINGS) {
            jobs[enc] = {
                want: jsIds(enc, corpus),
                got: loomIds(enc, files.corpus),
                count: loomCount(['--encoding', enc, files.corpus]),
                wantSpecial: jsIds(enc, specialBytes, true),
                gotSpecial: loomIds(enc, files.specials, ['--special']),
            };
            for (const p of Object.values(jobs[enc]))
                p.catch(() => {}); /* reported by the test that awaits it */
        }
    });

    after(() => {
        if (dir)
            fs.rmSync(dir, { recursive: true, force: true });
    });

    for (const enc of ENCODINGS) {
        test(`${enc}: the same ids over the whole corpus`,
             { timeout: TIMEOUT_MS }, async () => {
            const [want, got] = await Promise.all([jobs[enc].want,
                                                   jobs[enc].got]);
            assert.ok(want.length > 1e6, `${want.length} tokens`);
            assertSameIds(got, want, 'corpus', enc);
        });

        test(`${enc}: the count-only path counts the same`,
             { timeout: TIMEOUT_MS }, async () => {
            const [want, count] = await Promise.all([jobs[enc].want,
                                                     jobs[enc].count]);
            assert.equal(count, want.length);
        });

        test(`${enc}: special-token text as special tokens (--special)`,
             { timeout: TIMEOUT_MS }, async () => {
            const [want, got] = await Promise.all([jobs[enc].wantSpecial,
                                                   jobs[enc].gotSpecial]);
            const eot = getEncoding(enc).encode('<|endoftext|>', 'all');
            assert.equal(eot.length, 1);
            assert.ok(want.includes(eot[0]), 'the text has <|endoftext|>');
            assertSameIds(got, want, 'specials', enc);
        });

        test(`${enc}: lone surrogates count as U+FFFD`,
             { timeout: TIMEOUT_MS }, async () => {
            const e = getEncoding(enc);
            const want = e.encode(surrogateText, [], []);
            assert.match(surrogateText, /[\ud800-\udfff](?![\udc00-\udfff])/);
            assert.deepEqual(e.encode(surrogateText.toWellFormed(), [], []),
                             want, 'js-tiktoken: a lone surrogate is U+FFFD');
            assertSameIds(await loomIds(enc, files.surrogates), want,
                          'surrogates', enc);
        });
    }

    test('models count with their encoding', { timeout: TIMEOUT_MS },
         async () => {
        const f = files.specials;
        const o200k = await loomCount(['--encoding', 'o200k_base', f]);
        const cl100k = await loomCount(['--encoding', 'cl100k_base', f]);
        assert.notEqual(o200k, cl100k);
        for (const m of ['openai/gpt-4o', 'gpt-4.1-mini', 'gpt-5', 'o3-mini'])
            assert.equal(await loomCount(['--model', m, f]), o200k, m);
        for (const m of ['openai/gpt-4', 'gpt-3.5-turbo'])
            assert.equal(await loomCount(['--model', m, f]), cl100k, m);
        const { stdout, stderr } = await loom(
            ['--json', '--model', 'anthropic/claude-sonnet-4-5', f]);
        const j = JSON.parse(stdout);
        assert.equal(j.exact, false);
        assert.ok(j.tokens > 0);
        assert.match(stderr, /estimate/);
    });
});

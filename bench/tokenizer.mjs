/*
 * tokenizer.mjs: the node half of bench/tokenizer.sh.
 *
 *   node bench/tokenizer.mjs corpus DIR
 *       writes DIR/corpus.bin (tests/e2e/corpus.mjs, the corpus the
 *       exactness test uses) and DIR/kind-KIND.bin per kind of document;
 *       prints {"bytes": N, "kinds": {KIND: bytes}} as JSON
 *   node bench/tokenizer.mjs peers FILE ENCODING WASM_PASSES JS_PASSES
 *       times the npm packages on FILE (decoded as a TextDecoder does,
 *       not timed): tiktoken (WASM, encode_ordinary) and js-tiktoken
 *       (encode with no special tokens), the best of their passes (0
 *       passes: skipped); prints {"wasm": {"mbps", "tokens"}, "js": ...}
 *
 * The packages come from tests/e2e/node_modules (pinned there; `npm ci`).
 */
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { generateCorpus } from '../tests/e2e/corpus.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '..', 'tests', 'e2e',
                                        'package.json'));

function best(passes, fn) {
    let secs = Infinity, tokens = 0;
    for (let i = 0; i < passes; i++) {
        const t0 = process.hrtime.bigint();
        tokens = fn();
        const dt = Number(process.hrtime.bigint() - t0) / 1e9;
        secs = Math.min(secs, dt);
    }
    return { secs, tokens };
}

function corpus(dir) {
    const { docs, total } = generateCorpus();
    fs.mkdirSync(dir, { recursive: true });
    fs.writeFileSync(path.join(dir, 'corpus.bin'),
                     Buffer.concat(docs.map((d) => d.bytes)));
    const kinds = {};
    for (const d of docs)
        (kinds[d.kind] ||= []).push(d.bytes);
    const sizes = {};
    for (const [k, parts] of Object.entries(kinds)) {
        const b = Buffer.concat(parts);
        fs.writeFileSync(path.join(dir, `kind-${k}.bin`), b);
        sizes[k] = b.length;
    }
    console.log(JSON.stringify({ bytes: total, kinds: sizes }));
}

function peers(file, encoding, wasmPasses, jsPasses) {
    const bytes = fs.readFileSync(file);
    const text = new TextDecoder('utf-8', { ignoreBOM: true }).decode(bytes);
    const out = {};
    if (wasmPasses > 0) {
        const { get_encoding } = require('tiktoken');
        const enc = get_encoding(encoding);
        const r = best(wasmPasses, () => enc.encode_ordinary(text).length);
        enc.free();
        out.wasm = { mbps: bytes.length / r.secs / 1e6, tokens: r.tokens };
    }
    if (jsPasses > 0) {
        const { getEncoding } = require('js-tiktoken');
        const enc = getEncoding(encoding);
        const r = best(jsPasses, () => enc.encode(text, [], []).length);
        out.js = { mbps: bytes.length / r.secs / 1e6, tokens: r.tokens };
    }
    console.log(JSON.stringify(out));
}

const [cmd, ...args] = process.argv.slice(2);
if (cmd === 'corpus' && args.length === 1)
    corpus(args[0]);
else if (cmd === 'peers' && args.length === 4)
    peers(args[0], args[1], Number(args[2]), Number(args[3]));
else {
    process.stderr.write('usage: node bench/tokenizer.mjs corpus DIR | ' +
                         'peers FILE ENCODING WASM_PASSES JS_PASSES\n');
    process.exit(2);
}

/*
 * corpus-worker.mjs: encodes bytes with js-tiktoken on a worker thread
 * (tiktoken.test.mjs runs one per encoding, side by side).
 *
 * workerData: {encoding, bytes (Uint8Array), allowSpecial, cache}. The
 * bytes are decoded as a WHATWG TextDecoder does (U+FFFD for each maximal
 * invalid subpart, a leading BOM kept), then encoded; special-token text
 * is special only with allowSpecial. Posts back the ids as a Uint32Array.
 *
 * cache, when not null, is a folder: the ids are kept there in a file
 * named by a SHA-256 of the bytes, the encoding, allowSpecial,
 * js-tiktoken's version and node's version and Unicode version (what
 * decides the ids), and read back on the next run instead of encoding
 * again. js-tiktoken takes some 10 s per encoding of the corpus.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { parentPort, workerData } from 'node:worker_threads';
import { getEncoding } from 'js-tiktoken';

const { encoding, bytes, allowSpecial, cache } = workerData;
/* the package's exports do not include its package.json */
const version = JSON.parse(fs.readFileSync(new URL(
    './node_modules/js-tiktoken/package.json', import.meta.url))).version;

function cacheFile() {
    const h = crypto.createHash('sha256');
    h.update(JSON.stringify([encoding, !!allowSpecial, version,
                             process.version, process.versions.unicode]));
    h.update(bytes);
    return path.join(cache, `${h.digest('hex')}.u32`);
}

function cached(file) {
    try {
        const b = fs.readFileSync(file);
        if (b.length % 4 === 0)
            return new Uint32Array(b.buffer, b.byteOffset, b.length / 4)
                .slice();
    } catch {
        /* not there yet */
    }
    return null;
}

const file = cache ? cacheFile() : null;
let ids = file ? cached(file) : null;
if (!ids) {
    const text = new TextDecoder('utf-8', { ignoreBOM: true }).decode(bytes);
    ids = Uint32Array.from(
        getEncoding(encoding).encode(text, allowSpecial ? 'all' : [], []));
    if (file) {
        fs.mkdirSync(cache, { recursive: true });
        const tmp = `${file}.${process.pid}.tmp`;
        fs.writeFileSync(tmp, new Uint8Array(ids.buffer));
        fs.renameSync(tmp, file);
    }
}
parentPort.postMessage(ids, [ids.buffer]);

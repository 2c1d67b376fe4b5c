/*
 * convert.mjs: turns the tiktoken npm package's encoders into the files
 * loom's tokenizer loads (run by scripts/vocab.sh; see docs/tokenizer.md).
 *
 *   node convert.mjs ENCODERS_DIR OUT_DIR ENCODING...
 *
 * For each ENCODING it reads ENCODERS_DIR/ENCODING.json ({pat_str,
 * special_tokens, bpe_ranks}) and writes, atomically (temporary file and
 * rename):
 *
 *   OUT_DIR/ENCODING.tiktoken   the standard rank file: one line per
 *                               token, "BASE64 RANK", in rank order
 *   OUT_DIR/ENCODING.meta.json  {format, encoding, source, unicode,
 *                               pat_str, pattern, classes,
 *                               special_tokens, n_ranks}
 *
 * `pattern` is pat_str rewritten for PCRE2 so that loom splits text
 * exactly as JavaScript's RegExp (flags "ug") does in js-tiktoken on this
 * node: \s and \S become this node's whitespace ranges (PCRE2's \s is not
 * JavaScript's), and a case-insensitive group (?i:...) becomes a plain
 * group of [xX] letter pairs (js-tiktoken spells the contractions out in
 * both cases; Unicode case folding would also let 'ſ' match 's').
 * `classes` lists the group of every non-ASCII code point by this node's
 * Unicode tables (see groupRuns); loom matches on text whose non-ASCII
 * code points are replaced by representatives of their groups, so an
 * older Unicode version in PCRE2 does not matter. Both are checked against
 * the original pattern on sample text before anything is written.
 */
import fs from 'node:fs';
import path from 'node:path';

function fail(msg) {
    process.stderr.write(`convert: ${msg}\n`);
    process.exit(1);
}

/*
 * Class groups. The pattern may only use these properties, so what it does
 * with a code point depends only on the code point's group: W (JavaScript
 * \s), u l t m o (Lu Ll Lt Lm Lo), M (marks), N (numbers), - (anything
 * else). loom replaces every non-ASCII code point by a representative of
 * its group (as listed here by this node) before matching, so PCRE2's own
 * Unicode tables only ever see the representatives.
 */
const PROPS = new Set(['L', 'Lu', 'Ll', 'Lt', 'Lm', 'Lo', 'M', 'N']);
const GROUP_TESTS = [
    ['W', /^\s$/u], ['u', /^\p{Lu}$/u], ['l', /^\p{Ll}$/u],
    ['t', /^\p{Lt}$/u], ['m', /^\p{Lm}$/u], ['o', /^\p{Lo}$/u],
    ['M', /^\p{M}$/u], ['N', /^\p{N}$/u],
];
/* Same-length representatives, as loom uses them (tokenizer.c). */
const REPS = {
    u: [0x100, 0x1e00, 0x10400], l: [0x101, 0x1e01, 0x10428],
    t: [0x1c5, 0x1f88, null], m: [0x2b0, 0x3005, 0x16f93],
    o: [0x5d0, 0x4e00, 0x20000], M: [0x300, 0x901, 0x101fd],
    N: [0x660, 0x966, 0x1d7ce], '-': [0xa7, 0x2190, 0x1d100],
};

function groupOf(c) {
    if (c >= 0xd800 && c <= 0xdfff)
        return '-';
    const s = String.fromCodePoint(c);
    for (const [g, re] of GROUP_TESTS)
        if (re.test(s))
            return g;
    return '-';
}

let groupTable = null;
function groups() {
    if (!groupTable) {
        groupTable = new Array(0x110000);
        for (let c = 0; c < 0x110000; c++)
            groupTable[c] = groupOf(c);
    }
    return groupTable;
}

/* "START:G,START:G,..." (hex) for every code point from U+0080 up. */
function groupRuns() {
    const g = groups();
    const runs = [];
    for (let c = 0x80; c < 0x110000; c++)
        if (c === 0x80 || g[c] !== g[c - 1])
            runs.push(`${c.toString(16)}:${g[c]}`);
    return runs.join(',');
}

/* The JavaScript whitespace (\s) as PCRE2 class ranges, no brackets. */
function wsRanges() {
    const g = groups();
    let out = '';
    const hex = (c) => `\\x{${c.toString(16)}}`;
    for (let c = 0; c < 0x110000; c++) {
        if (g[c] !== 'W' && !(c < 0x80 && /^\s$/u.test(String.fromCharCode(c))))
            continue;
        let e = c;
        while (e + 1 < 0x110000 && (g[e + 1] === 'W' ||
               (e + 1 < 0x80 && /^\s$/u.test(String.fromCharCode(e + 1)))))
            e++;
        out += e === c ? hex(c) : `${hex(c)}-${hex(e)}`;
        c = e;
    }
    return out;
}

/* Reads one escape at pat[i] == '\\'; returns {text, end}. */
function readEscape(pat, i) {
    const c = pat[i + 1];
    if (c === undefined)
        fail('pattern ends in a backslash');
    if (c === 'p' || c === 'P') {
        const close = pat.indexOf('}', i);
        if (pat[i + 2] !== '{' || close < 0)
            fail(`bad property escape at ${i}`);
        const name = pat.slice(i + 3, close);
        if (!PROPS.has(name))
            fail(`property \\p{${name}} is not supported (loom groups ` +
                 'code points by L, Lu, Ll, Lt, Lm, Lo, M and N only)');
        return { text: pat.slice(i, close + 1), end: close + 1 };
    }
    if ('dDwWbBkcux0123456789'.includes(c))
        fail(`escape \\${c} is not supported by the converter`);
    return { text: pat.slice(i, i + 2), end: i + 2 };
}

/*
 * pat_str rewritten for PCRE2 with JavaScript's semantics: \s and \S
 * become this node's whitespace ranges, (?i:...) a plain group with [xX]
 * letter pairs; \p{..} stay (they only ever see representatives).
 */
function toPcre2(pat) {
    const ws = wsRanges();
    let out = '';
    const groupsStack = []; /* is each open group case-insensitive? */
    let caseless = false;
    let inClass = false;
    for (let i = 0; i < pat.length;) {
        const c = pat[i];
        if (c === '\\') {
            const e = readEscape(pat, i);
            const k = e.text[1];
            if (k === 's')
                out += inClass ? ws : `[${ws}]`;
            else if (k === 'S' && !inClass)
                out += `[^${ws}]`;
            else if (k === 'S')
                fail('\\S inside a class is not supported');
            else
                out += e.text;
            i = e.end;
        } else if (inClass) {
            if (c === ']')
                inClass = false;
            else if (caseless && /[A-Za-z]/.test(c))
                fail('letters in a class inside (?i:) are not supported');
            out += c;
            i++;
        } else if (c === '[') {
            inClass = true;
            out += c;
            i++;
            if (pat[i] === '^')
                out += pat[i++];
        } else if (c === '(') {
            if (pat.startsWith('(?i:', i)) {
                groupsStack.push(caseless);
                caseless = true;
                out += '(?:';
                i += 4;
                continue;
            }
            if (pat.startsWith('(?', i) && !pat.startsWith('(?:', i) &&
                !pat.startsWith('(?!', i) && !pat.startsWith('(?=', i))
                fail(`group syntax at ${i} is not supported`);
            groupsStack.push(caseless);
            out += '(';
            i++;
        } else if (c === ')') {
            if (!groupsStack.length)
                fail('unbalanced )');
            caseless = groupsStack.pop();
            out += ')';
            i++;
        } else if (caseless && /[A-Za-z]/.test(c)) {
            out += `[${c.toLowerCase()}${c.toUpperCase()}]`;
            i++;
        } else {
            const cp = pat.codePointAt(i);
            if (cp > 0x7f)
                fail('non-ASCII literal text in the pattern is not supported');
            out += c;
            i++;
        }
    }
    if (groupsStack.length || inClass)
        fail('unbalanced ( or [');
    return out;
}

/* Piece lengths (in code points) a JS pattern splits text into. */
function split(source, text) {
    return [...text.matchAll(new RegExp(source, 'ug'))]
        .map((m) => [m.index, [...m[0]].length]);
}

/* 're -> 're 'rE 'Re 'RE (js-tiktoken's spelling of the contractions) */
function caseVariants(alt) {
    let out = [''];
    for (const ch of alt) {
        const l = ch.toLowerCase(), u = ch.toUpperCase();
        out = out.flatMap((p) => l === u ? [p + ch] : [p + l, p + u]);
    }
    return out;
}

/* Every non-ASCII, non-whitespace code point replaced by its group's
 * representative (what loom does before matching). */
function normalise(text) {
    const g = groups();
    let out = '';
    for (const ch of text) {
        const c = ch.codePointAt(0);
        const len = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
        if (c < 0x80 || g[c] === 'W') {
            out += ch;
            continue;
        }
        const rep = REPS[g[c]][len - 2];
        if (rep == null)
            fail(`no ${len}-byte representative for group ${g[c]}`);
        out += String.fromCodePoint(rep);
    }
    return out;
}

/*
 * Checks, on sample text, that the rewritten pattern (as a JS regex) on
 * the normalised text splits like js-tiktoken's pattern on the original,
 * and that every representative is in its own group.
 */
function check(pat, pcre) {
    const g = groups();
    for (const [grp, reps] of Object.entries(REPS))
        for (const r of reps)
            if (r != null && g[r] !== grp)
                fail(`representative U+${r.toString(16)} is not in ${grp}`);
    const jsPat = pat.replace(/\(\?i:([^()]*)\)/g, (_, alts) =>
        '(' + alts.split('|').flatMap(caseVariants).join('|') + ')');
    const back = pcre.replace(/\\x\{([0-9a-f]+)\}/g, '\\u{$1}');
    let sample = "Hello, World! It'S DON'T we'Re i'ſ  \t\n\n\r\n 123456 " +
        'naïve café ÉCOLE Ünïcödé 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 日本語のテキスト 한국어 ' +
        'العربية हिन्दी 👩‍👩‍👧‍👦 🇫🇷 \u00a0\u2003\u3000\ufeff\u0085 x\u180e' +
        '  \n  end    ǅungla ᾈ';
    for (let c = 0x80; c < 0x110000; c += 3) {
        if (c < 0xd800 || c > 0xdfff)
            sample += String.fromCodePoint(c);
        if (c % 97 === 0)
            sample += c % 2 ? ' ' : "'s";
    }
    const a = JSON.stringify(split(jsPat, sample));
    const b = JSON.stringify(split(back, normalise(sample)));
    if (a !== b)
        fail('the rewritten pattern splits text differently');
}

function writeAtomic(file, data) {
    const tmp = `${file}.tmp${process.pid}`;
    fs.writeFileSync(tmp, data);
    fs.renameSync(tmp, file);
}

function main() {
    const [encDir, outDir, ...names] = process.argv.slice(2);
    if (!encDir || !outDir || !names.length)
        fail('usage: node convert.mjs ENCODERS_DIR OUT_DIR ENCODING...');
    const pkg = JSON.parse(fs.readFileSync(
        path.join(encDir, '..', 'package.json'), 'utf8'));
    fs.mkdirSync(outDir, { recursive: true });
    for (const name of names) {
        const src = JSON.parse(fs.readFileSync(
            path.join(encDir, `${name}.json`), 'utf8'));
        if (typeof src.pat_str !== 'string' ||
            typeof src.bpe_ranks !== 'string' ||
            typeof src.special_tokens !== 'object')
            fail(`${name}.json lacks pat_str, bpe_ranks or special_tokens`);
        /* bpe_ranks: lines "! OFFSET TOKEN TOKEN ...", ranks consecutive */
        const lines = [];
        let n = 0;
        for (const line of src.bpe_ranks.split('\n')) {
            if (!line)
                continue;
            const [, off, ...toks] = line.split(' ');
            const base = Number.parseInt(off, 10);
            if (!Number.isInteger(base))
                fail(`${name}: bad rank offset '${off}'`);
            toks.forEach((t, i) => lines.push(`${t} ${base + i}\n`));
            n += toks.length;
        }
        const pattern = toPcre2(src.pat_str);
        check(src.pat_str, pattern);
        const classes = groupRuns();
        const meta = {
            format: 1,
            encoding: name,
            source: `tiktoken@${pkg.version}`,
            unicode: process.versions.unicode,
            pat_str: src.pat_str,
            pattern,
            classes,
            special_tokens: src.special_tokens,
            n_ranks: n,
        };
        writeAtomic(path.join(outDir, `${name}.tiktoken`), lines.join(''));
        writeAtomic(path.join(outDir, `${name}.meta.json`),
                    JSON.stringify(meta, null, 1) + '\n');
        process.stdout.write(`vocab: ${name}: ${n} ranks, ` +
            `${Object.keys(src.special_tokens).length} special tokens, ` +
            `Unicode ${meta.unicode}\n`);
    }
}

main();

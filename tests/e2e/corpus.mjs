/*
 * corpus.mjs: a deterministic corpus for comparing tokenizers
 * (tiktoken.test.mjs, bench/tokenizer.sh).
 *
 * generateCorpus({bytes, seed}) returns {docs: [{kind, bytes}], total}:
 * documents of every kind below, in a seeded pseudo-random order, until
 * `total` reaches `bytes`. The same seed always gives the same bytes.
 *
 * Kinds: English prose (contractions in every case, numbers, URLs), CJK,
 * Arabic, Devanagari, other scripts (Cyrillic, Greek, Hebrew, Thai,
 * decomposed accents, titlecase digraphs, 4-byte letters, letters
 * assigned in Unicode 15-17), code, JSON, emoji (modifiers, ZWJ
 * sequences, flags, keycaps, tags), digits (long runs, other numerals),
 * whitespace (runs, every JavaScript \s character and some that are not:
 * U+0085, U+180E, U+200B), special-token text, random code points from
 * every plane, and invalid UTF-8 (stray continuation bytes, overlongs,
 * encoded surrogates, truncated sequences, bytes past U+10FFFF). Only the
 * `invalid` kind holds invalid UTF-8; `surrogates` documents are JS
 * strings with lone surrogates (their bytes, as Buffer.from writes them,
 * have U+FFFD in their place) and are also returned as `text`.
 */

/* mulberry32: small, fast, and the same everywhere */
export function rng(seed) {
    let a = seed >>> 0;
    const next = () => {
        a = (a + 0x6d2b79f5) >>> 0;
        let t = a;
        t = Math.imul(t ^ (t >>> 15), t | 1);
        t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
    const int = (lo, hi) => lo + Math.floor(next() * (hi - lo + 1));
    const pick = (arr) => arr[Math.floor(next() * arr.length)];
    const cp = (lo, hi) => String.fromCodePoint(int(lo, hi));
    return { next, int, pick, cp };
}

const WORDS = (
    'the of and to in is was for on that with as by at from it be this an ' +
    'are or which have has had not but all were when there can more one ' +
    'time about would their will other into than its only some could new ' +
    'people these after first also two way may like well very many where ' +
    'system model token agent request function value error result server ' +
    'between through because however although tokenization encoder ' +
    'internationalization antidisestablishmentarianism pneumonia ' +
    'Schwarzwälder Kirschtorte naïve café résumé façade coöperate Zürich'
).split(' ');
const CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S",
    "'T", "'RE", "'Re", "'rE", "'VE", "'M", "'LL", "'lL", "'D", "'ſ",
    "’s", "'x", "''", "'"];
const PUNCT = ['.', ',', ';', ':', '!', '?', '...', ' - ', ' — ', '(', ')',
    '"', '«', '»', '“', '”', '/', '//', '\\', '&&', '#', '@', '%', '*'];

function english(r) {
    let s = '';
    const sentences = r.int(3, 12);
    for (let i = 0; i < sentences; i++) {
        const n = r.int(4, 25);
        for (let w = 0; w < n; w++) {
            let word = r.pick(WORDS);
            const roll = r.next();
            if (w === 0 || roll < 0.05)
                word = word[0].toUpperCase() + word.slice(1);
            else if (roll < 0.08)
                word = word.toUpperCase();
            if (r.next() < 0.07)
                word += r.pick(CONTRACTIONS);
            if (r.next() < 0.04)
                word = String(r.int(0, 1e6)) + (r.next() < 0.5 ? '' : 'th');
            if (r.next() < 0.01)
                word = `https://example.com/${word}/${r.int(1, 999)}?q=a&b=c`;
            s += (w ? ' ' : '') + word;
            if (r.next() < 0.1)
                s += r.pick(PUNCT);
        }
        s += r.pick(['.', '!', '?', '.\n', '.\n\n', '. ', '.\r\n']);
        s += r.next() < 0.5 ? ' ' : '';
    }
    return s;
}

const HAN = '的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年' +
    '得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起' +
    '还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动';
function cjk(r) {
    let s = '';
    const n = r.int(20, 200);
    for (let i = 0; i < n; i++) {
        const roll = r.next();
        if (roll < 0.35)
            s += HAN[r.int(0, HAN.length - 1)];
        else if (roll < 0.45)
            s += r.cp(0x4e00, 0x9fff);
        else if (roll < 0.6)
            s += r.cp(0x3041, 0x3096); /* hiragana */
        else if (roll < 0.7)
            s += r.cp(0x30a1, 0x30fa); /* katakana */
        else if (roll < 0.8)
            s += r.cp(0xac00, 0xd7a3); /* hangul */
        else if (roll < 0.88)
            s += r.pick(['。', '、', '「', '」', '！', '？', '・', 'ー',
                '（', '）', '：', '\u3000', ' ', '\n']);
        else if (roll < 0.92)
            s += r.cp(0xff10, 0xff19) + r.cp(0xff21, 0xff3a); /* fullwidth */
        else if (roll < 0.95)
            s += r.cp(0x20000, 0x2a6df); /* Ext B (4 bytes) */
        else if (roll < 0.97)
            s += r.cp(0x31350, 0x323af); /* Ext H (Unicode 15.0) */
        else if (roll < 0.985)
            s += r.cp(0x2ebf0, 0x2ee5d); /* Ext I (Unicode 15.1) */
        else
            s += r.pick(['AI', 'GPU', 'loom', '2024年', '3.14']);
    }
    return s;
}

function arabic(r) {
    let s = '';
    const words = r.int(10, 80);
    for (let w = 0; w < words; w++) {
        const n = r.int(2, 8);
        for (let i = 0; i < n; i++) {
            s += r.cp(0x0621, 0x064a);
            if (r.next() < 0.3)
                s += r.cp(0x064b, 0x0652); /* harakat (Mn) */
            if (r.next() < 0.03)
                s += '\u0640'; /* tatweel (Lm) */
        }
        s += r.pick([' ', ' ', ' ', '، ', '؟ ', '. ', '\u200f ', '\n',
            ` ${r.cp(0x0660, 0x0669)}${r.cp(0x0660, 0x0669)} `, ' (',
            ') ', ' «', '» ', ' ﷺ ', ' ﻻ ']);
    }
    return s;
}

function devanagari(r) {
    let s = '';
    const words = r.int(10, 80);
    for (let w = 0; w < words; w++) {
        const n = r.int(1, 5);
        for (let i = 0; i < n; i++) {
            s += r.cp(0x0915, 0x0939);
            const roll = r.next();
            if (roll < 0.4)
                s += r.cp(0x093e, 0x094c); /* vowel signs (Mc/Mn) */
            else if (roll < 0.5)
                s += '\u094d'; /* virama */
            else if (roll < 0.55)
                s += '\u093c'; /* nukta */
            if (r.next() < 0.1)
                s += r.pick(['\u0902', '\u0901', '\u0903']);
        }
        s += r.pick([' ', ' ', ' ', '। ', '॥\n', ', ', ` ${r.cp(0x0966,
            0x096f)}${r.cp(0x0966, 0x096f)} `, ' - ']);
    }
    return s;
}

const OTHER_RANGES = [
    [0x0410, 0x044f], [0x0391, 0x03c9], [0x05d0, 0x05ea], [0x0e01, 0x0e30],
    [0x0e31, 0x0e3a], [0x10d0, 0x10fa], [0x0531, 0x0556], [0x1200, 0x1248],
    [0x00c0, 0x024f], [0x1e00, 0x1eff], [0x1d400, 0x1d7ff], /* math */
    [0x10400, 0x1044f], /* Deseret */ [0x11f04, 0x11f10], /* Kawi, 15.0 */
    [0x1e4d0, 0x1e4eb], /* Nag Mundari, 15.0 */ [0x10d4a, 0x10d65],
    /* Garay, 16.0 */ [0x16100, 0x1611d], /* Gurung Khema, 16.0 */
    [0x11380, 0x11389], /* Tulu-Tigalari, 16.0 */ [0x0300, 0x036f],
    /* combining */ [0x02b0, 0x02ff], /* modifiers */ [0x2160, 0x2188],
    /* roman numerals (Nl) */ [0x2460, 0x24ff], /* circled */
];
const TITLE = ['ǅ', 'ǈ', 'ǋ', 'ǲ', 'ᾈ', 'ᾏ', 'ᾼ', 'ῌ', 'ῼ'];
function otherScripts(r) {
    let s = '';
    const words = r.int(10, 80);
    for (let w = 0; w < words; w++) {
        const [lo, hi] = r.pick(OTHER_RANGES);
        const n = r.int(1, 9);
        if (r.next() < 0.1)
            s += r.pick(TITLE);
        for (let i = 0; i < n; i++) {
            s += r.cp(lo, hi);
            if (r.next() < 0.05)
                s += r.cp(0x0300, 0x036f); /* decomposed accents */
        }
        if (r.next() < 0.05)
            s += 'e\u0301\u0302\u0303\u0304'; /* stacked marks */
        s += r.pick([' ', ' ', ', ', '. ', '\n', "'s ", "'S ", '’ ']);
    }
    return s;
}

const IDENTS = ['i', 'j', 'buf', 'len', 'ctx', 'userId', 'parseJSON',
    'HTTPServer', 'max_tokens', 'LOOM_EINVALID', 'x1', '_private',
    'getElementById', 'XMLHttpRequest', 'snake_case_name', 'ÄpfelZähler'];
const OPS = [' = ', ' == ', ' === ', ' !== ', ' => ', ' -> ', ' += ',
    ' >>= ', ' && ', ' || ', '++', '--', ' ?? ', '::', '.', '->', ' < ',
    ' <= ', ' % ', ' ^ ', ' ~', '!'];
function code(r) {
    const nl = r.next() < 0.2 ? '\r\n' : '\n';
    const indent = r.pick(['    ', '  ', '\t', '        ']);
    let s = '';
    const lines = r.int(10, 60);
    let depth = 0;
    for (let l = 0; l < lines; l++) {
        s += indent.repeat(depth);
        const roll = r.next();
        if (roll < 0.15) {
            s += `function ${r.pick(IDENTS)}(${r.pick(IDENTS)}, ` +
                `${r.pick(IDENTS)}) {`;
            depth++;
        } else if (roll < 0.25 && depth > 0) {
            depth--;
            s = s.slice(0, s.length - indent.length) + '}';
        } else if (roll < 0.35) {
            s += `// ${english(r).split('\n')[0].slice(0, 70)}`;
        } else if (roll < 0.42) {
            s += `/* ${r.pick(WORDS)} */ /** @param {string} x */`;
        } else if (roll < 0.5) {
            s += `const s = "${r.pick(WORDS)}\\n\\t\\"` +
                `${r.pick(IDENTS)}\\u00e9";`;
        } else if (roll < 0.55) {
            s += `#include <${r.pick(['stdio', 'sys/types', 'loom/tok'])}.h>`;
        } else if (roll < 0.6) {
            s += `path = "/usr/local/${r.pick(IDENTS)}//x/";  // a/b/c///`;
        } else if (roll < 0.65) {
            s += `x = 0x${r.int(0, 0xffffff).toString(16).toUpperCase()}u + ` +
                `${r.int(0, 999)}.${r.int(0, 999)}e-${r.int(1, 30)};`;
        } else {
            s += `${r.pick(IDENTS)}${r.pick(OPS)}${r.pick(IDENTS)}` +
                `${r.pick(OPS)}${r.int(0, 100)};`;
        }
        if (r.next() < 0.05)
            s += ' '.repeat(r.int(1, 5)); /* trailing whitespace */
        s += nl;
        if (r.next() < 0.08)
            s += nl;
    }
    return s;
}

function jsonValue(r, depth) {
    const roll = r.next();
    if (depth > 4 || roll < 0.3)
        return r.pick([r.int(-1e6, 1e6), r.next() * 1000, true, false, null,
            r.pick(WORDS), `${r.pick(WORDS)} ${r.pick(WORDS)}`, '',
            'café ☕ 日本', 'line\nbreak\t"quoted"']);
    if (roll < 0.6) {
        const a = [];
        for (let i = r.int(0, 6); i > 0; i--)
            a.push(jsonValue(r, depth + 1));
        return a;
    }
    const o = {};
    for (let i = r.int(0, 6); i > 0; i--)
        o[r.pick(IDENTS)] = jsonValue(r, depth + 1);
    return o;
}
function json(r) {
    const v = { id: r.int(1, 1e9), data: jsonValue(r, 0) };
    const style = r.int(0, 3);
    let s = JSON.stringify(v, null, [0, 2, 4, '\t'][style]);
    if (r.next() < 0.3)
        s = s.replace(/[\u0080-\uffff]/g,
            (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'));
    return s + '\n';
}

const EMOJI = ['😀', '😂', '🤖', '🚀', '❤️', '☺', '✨', '👍🏽', '👋🏿',
    '👩‍👩‍👧‍👦', '👨🏻‍💻', '🧑‍🤝‍🧑', '🏳️‍🌈', '🏴‍☠️', '🇫🇷', '🇯🇵🇺🇸',
    '1️⃣', '#️⃣', '🏴󠁧󠁢󠁳󠁣󠁴󠁿', '🫨', '🪿', '🫎', '🪾', '🫟', '©️',
    '™', '♀️', '🙂‍↔️', '🐦‍🔥', '👁️‍🗨️'];
function emoji(r) {
    let s = '';
    const n = r.int(10, 100);
    for (let i = 0; i < n; i++) {
        const roll = r.next();
        if (roll < 0.5)
            s += r.pick(EMOJI);
        else if (roll < 0.6)
            s += r.cp(0x1f300, 0x1faff);
        else if (roll < 0.7)
            s += r.cp(0x1f1e6, 0x1f1ff); /* lone regional indicators */
        else if (roll < 0.75)
            s += '\u200d'; /* stray ZWJ */
        else if (roll < 0.8)
            s += r.pick(['\ufe0f', '\ufe0e', r.cp(0x1f3fb, 0x1f3ff)]);
        else
            s += r.pick([' ', ' ', 'ok ', 'lol', '!', '\n', "it's "]);
    }
    return s;
}

function digits(r) {
    let s = '';
    const n = r.int(5, 40);
    for (let i = 0; i < n; i++) {
        const roll = r.next();
        let d = '';
        if (roll < 0.3) {
            for (let k = r.int(1, roll < 0.02 ? 400 : 40); k > 0; k--)
                d += String(r.int(0, 9));
        } else if (roll < 0.45) {
            d = r.int(0, 1e9).toLocaleString('en-US') + '.' + r.int(0, 99);
        } else if (roll < 0.55) {
            for (let k = r.int(1, 12); k > 0; k--)
                d += r.pick([r.cp(0x0660, 0x0669), r.cp(0x0966, 0x096f),
                    r.cp(0xff10, 0xff19), r.cp(0x1d7ce, 0x1d7ff), '²', '½',
                    'Ⅻ', '①', '௰', '𝟘']);
        } else if (roll < 0.7) {
            d = `abc${r.int(0, 99999)}def${r.int(0, 9)}`;
        } else if (roll < 0.8) {
            d = `v${r.int(0, 9)}.${r.int(0, 99)}.${r.int(0, 999)}-rc${r.int(1,
                9)}`;
        } else {
            d = `+1 (${r.int(100, 999)}) ${r.int(100, 999)}-${r.int(1000,
                9999)}`;
        }
        s += d + r.pick([' ', '\n', ', ', '', '\t']);
    }
    return s;
}

const WS = ['\t', '\n', '\v', '\f', '\r', ' ', '\u00a0', '\u1680', '\u2000',
    '\u2005', '\u200a', '\u2028', '\u2029', '\u202f', '\u205f', '\u3000',
    '\ufeff', '\r\n'];
const NOT_WS = ['\u0085', '\u180e', '\u200b', '\u200c', '\u2060', '\u00ad'];
function whitespace(r) {
    let s = '';
    const n = r.int(10, 60);
    for (let i = 0; i < n; i++) {
        const roll = r.next();
        if (roll < 0.3)
            /* js-tiktoken's merge is quadratic: long runs are rare */
            s += ' '.repeat(r.next() < 0.01 ? r.int(100, 400) :
                r.int(1, 40));
        else if (roll < 0.45)
            s += r.pick(['\n', '\t', '\r\n', ' \n', '\n\n\n', '\t\t']).repeat(
                r.int(1, 12));
        else if (roll < 0.65)
            for (let k = r.int(1, 12); k > 0; k--)
                s += r.pick(WS);
        else if (roll < 0.72)
            s += r.pick(NOT_WS);
        else
            s += r.pick(['word', 'Word', '!', '.', '1', '日', 'é', "'s",
                '/', 'x/\n', '))']);
    }
    return s;
}

const SPECIALS = ['<|endoftext|>', '<|endofprompt|>', '<|fim_prefix|>',
    '<|fim_middle|>', '<|fim_suffix|>', '<|im_start|>', '<|endoftext',
    '<|endoftext|>>', '<<|endoftext|>', '<|ENDOFTEXT|>', '<|', '|>'];
function specials(r) {
    let s = '';
    const n = r.int(5, 30);
    for (let i = 0; i < n; i++)
        s += r.pick([english(r).slice(0, r.int(0, 80)), ' ', '\n', '']) +
            r.pick(SPECIALS);
    return s;
}

function randomCodePoints(r) {
    let s = '';
    const n = r.int(20, 300);
    for (let i = 0; i < n; i++) {
        const roll = r.next();
        let c;
        if (roll < 0.3)
            c = r.int(0, 0x7f);
        else if (roll < 0.6)
            c = r.int(0x80, 0xffff);
        else if (roll < 0.9)
            c = r.int(0x10000, 0x3ffff);
        else
            c = r.pick([0xfffe, 0xffff, 0x10ffff, 0xe000, 0xf8ff, 0xe0001,
                0xe0100, 0x0, 0x1b, 0x7f, 0x9f, r.int(0x40000, 0x10ffff)]);
        if (c >= 0xd800 && c <= 0xdfff)
            c = 0xfffd;
        s += String.fromCodePoint(c);
    }
    return s;
}

function surrogates(r) {
    let s = '';
    const n = r.int(5, 40);
    for (let i = 0; i < n; i++)
        s += r.pick(['a', ' ', 'x\ud800', '\udfff', '\ud83d', '\ude00y',
            '😀', '\ud800\ud800', "'s", '1', '\udc00 ', '日']);
    return s;
}

const BAD = [[0x80], [0xbf], [0xc0, 0xaf], [0xc1, 0xbf], [0xf5], [0xff],
    [0xfe], [0xe2, 0x82], [0xe2], [0xf0, 0x9f, 0x98], [0xe0, 0x80, 0x80],
    [0xed, 0xa0, 0x80], [0xed, 0xbf, 0xbf], [0xf4, 0x90, 0x80, 0x80],
    [0xf0, 0x80, 0x80, 0xaf], [0xc3], [0xc3, 0x28], [0xe2, 0x28, 0xa1],
    [0xf0, 0x28, 0x8c, 0xbc], [0x80, 0x80, 0x80, 0x80]];
function invalid(r) {
    const parts = [];
    const n = r.int(10, 60);
    for (let i = 0; i < n; i++) {
        const roll = r.next();
        if (roll < 0.4)
            parts.push(Buffer.from(r.pick(BAD)));
        else if (roll < 0.5)
            parts.push(Buffer.from([r.int(0x80, 0xff)]));
        else
            parts.push(Buffer.from(r.pick(['a', 'word ', ' ', 'é', '日本',
                '😀', "'s", '1', '\n', 'x']), 'utf8'));
    }
    return Buffer.concat(parts);
}

export const KINDS = {
    english: [english, 30], cjk: [cjk, 8], arabic: [arabic, 5],
    devanagari: [devanagari, 5], other: [otherScripts, 6], code: [code, 15],
    json: [json, 10], emoji: [emoji, 5], digits: [digits, 5],
    whitespace: [whitespace, 4], specials: [specials, 2],
    random: [randomCodePoints, 3], surrogates: [surrogates, 1],
    invalid: [invalid, 1],
};

export function generateCorpus({ bytes = 10.6e6, seed = 20240501 } = {}) {
    const r = rng(seed);
    const table = [];
    for (const [kind, [, weight]] of Object.entries(KINDS))
        for (let i = 0; i < weight; i++)
            table.push(kind);
    const docs = [];
    let total = 0;
    while (total < bytes) {
        const kind = r.pick(table);
        const out = KINDS[kind][0](r);
        const doc = { kind };
        if (Buffer.isBuffer(out)) {
            doc.bytes = out;
        } else {
            doc.bytes = Buffer.from(out, 'utf8');
            if (kind === 'surrogates')
                doc.text = out;
        }
        docs.push(doc);
        total += doc.bytes.length;
    }
    return { docs, total };
}

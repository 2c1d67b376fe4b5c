/*
 * markdown.js: model text to safe HTML. marked renders the Markdown
 * (code blocks highlighted by highlight.js) and
 * DOMPurify sanitises the result (the model's text is untrusted: it may
 * hold HTML, script or event handlers); links then open in a new tab
 * with rel="noopener noreferrer". Raw HTML in the text is shown as text.
 * Neither renderer nor sanitiser is hand-rolled; the page's
 * Content-Security-Policy (no inline script) is the second wall.
 */
import { Marked } from './vendor/marked.esm.js';
import DOMPurify from './vendor/purify.es.mjs';
import hljs from './vendor/highlight.min.js';

/* Raw HTML in the model's Markdown is shown as the text it is, never
 * rendered: an answer quoting <script> reads as such. */
function escapeHtml(s) {
    return s.replace(/&/g, '&amp;').replace(/</g, '&lt;')
        .replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

const marked = new Marked({
    gfm: true,
    breaks: false,
    async: false,
    renderer: {
        html(token) {
            return escapeHtml(token.text);
        },
        /* Code blocks highlighted when their language is named and known
         * (no guessing); highlight.js escapes the code itself. */
        code(token) {
            const lang = (token.lang || '').split(/\s/)[0];
            const known = lang && hljs.getLanguage(lang);
            const body = known
                ? hljs.highlight(token.text, { language: lang,
                                               ignoreIllegals: true }).value
                : escapeHtml(token.text);
            const cls = known ? ` language-${escapeHtml(lang)}` : '';
            return `<pre><code class="hljs${cls}">${body}</code></pre>\n`;
        },
    },
});

DOMPurify.addHook('afterSanitizeAttributes', (node) => {
    if (node.tagName === 'A' && node.hasAttribute('href')) {
        node.setAttribute('target', '_blank');
        node.setAttribute('rel', 'noopener noreferrer');
    }
});

const PURIFY = {
    USE_PROFILES: { html: true },
    FORBID_TAGS: ['style', 'form', 'input', 'button', 'textarea', 'select',
                  'iframe', 'object', 'embed'],
    FORBID_ATTR: ['style', 'id', 'name'],
};

/* Sets el's content to text rendered as Markdown, sanitised. */
export function renderMarkdown(el, text) {
    const html = marked.parse(text || '');
    el.replaceChildren(DOMPurify.sanitize(html, { ...PURIFY,
                                                   RETURN_DOM_FRAGMENT: true }));
}

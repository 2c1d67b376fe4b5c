/*
 * api.js: the web UI's calls to loom's native API (docs/server.md), with
 * the API key the user signed in with (localStorage "loom.key") as a
 * bearer token, and a reader of the run event stream (SSE over fetch:
 * EventSource cannot POST nor send a bearer token).
 *
 * A 401 from any call runs the handler set with onUnauthorized (the app
 * shows its sign-in screen) and throws an ApiError.
 */

const KEY = 'loom.key';

let unauthorized = () => {};

export class ApiError extends Error {
    constructor(status, message, code) {
        super(message);
        this.status = status;
        this.code = code;
    }
}

export function setUnauthorizedHandler(fn) {
    unauthorized = fn;
}

export function apiKey() {
    return localStorage.getItem(KEY) || '';
}

export function setApiKey(key) {
    if (key)
        localStorage.setItem(KEY, key);
    else
        localStorage.removeItem(KEY);
}

function headers(extra = {}) {
    const h = { ...extra };
    const key = apiKey();
    if (key)
        h.Authorization = `Bearer ${key}`;
    return h;
}

/* Throws an ApiError for a non-2xx answer (its OpenAI-shaped message). */
async function check(res) {
    if (res.ok)
        return res;
    let message = `${res.status} ${res.statusText}`, code = null;
    try {
        const body = await res.json();
        if (body && body.error) {
            message = body.error.message || message;
            code = body.error.code || null;
        }
    } catch {
        /* not JSON: keep the status line */
    }
    if (res.status === 401)
        unauthorized();
    throw new ApiError(res.status, message, code);
}

/* method path [body]: the answer's JSON (null for an empty body). */
export async function call(method, path, body, signal) {
    const init = { method, headers: headers(), signal };
    if (body !== undefined) {
        init.headers['Content-Type'] = 'application/json';
        init.body = JSON.stringify(body);
    }
    const res = await check(await fetch(path, init));
    const text = await res.text();
    return text ? JSON.parse(text) : null;
}

/*
 * Reads an SSE body, calling onEvent(event) with each event's parsed
 * data (the native format: the data is the whole event, with its seq).
 * Resolves when the stream ends.
 */
async function readEvents(res, onEvent) {
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = '';
    for (;;) {
        const { value, done } = await reader.read();
        if (done)
            break;
        buf += decoder.decode(value, { stream: true });
        let end;
        while ((end = buf.search(/\r?\n\r?\n/)) >= 0) {
            const block = buf.slice(0, end);
            buf = buf.slice(buf[end] === '\r' ? end + 4 : end + 2);
            const data = [];
            for (const line of block.split(/\r?\n/)) {
                if (line.startsWith('data:'))
                    data.push(line.slice(line[5] === ' ' ? 6 : 5));
            }
            if (data.length)
                onEvent(JSON.parse(data.join('\n')));
        }
    }
}

/*
 * POST /v1/runs with stream: the run's ids (from the headers, known
 * before any output) go to onStart({runId, conversationId}), then each
 * event to onEvent. Resolves when the stream ends.
 */
export async function startRun(body, onStart, onEvent, signal) {
    const res = await check(await fetch('/v1/runs', {
        method: 'POST',
        headers: headers({ 'Content-Type': 'application/json',
                           Accept: 'text/event-stream' }),
        body: JSON.stringify({ ...body, stream: true }),
        signal,
    }));
    onStart({ runId: res.headers.get('X-Loom-Run-Id'),
              conversationId: res.headers.get('X-Loom-Conversation-Id') });
    await readEvents(res, onEvent);
}

/* GET /v1/runs/{id}/events after seq `after` (Last-Event-ID). */
export async function followRun(runId, after, onEvent, signal) {
    const h = headers({ Accept: 'text/event-stream' });
    if (after > 0)
        h['Last-Event-ID'] = String(after);
    const res = await check(await fetch(
        `/v1/runs/${encodeURIComponent(runId)}/events`, { headers: h, signal }));
    await readEvents(res, onEvent);
}

/* GET with the answer as text (the research report). */
export async function getText(path) {
    const res = await check(await fetch(path, { headers: headers() }));
    return res.text();
}

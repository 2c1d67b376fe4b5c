/*
 * app.js: the web UI's page (docs/ui.md): the sign-in screen, the
 * conversations sidebar, the agent/model picker and the chat itself.
 *
 * Runs start with POST /v1/runs {stream, background, title}: the answer
 * streams into a TurnView, and as a background run it goes on when the
 * page goes away. Which run a conversation is waiting for is kept in
 * localStorage ("loom.pending": conversation id -> run id and question)
 * until it ends, so a reload, or the conversation opened again, replays
 * the run's events (GET /v1/runs/{id}/events) and follows it to its end;
 * a stream cut while the page stays resumes after the last event seen
 * (Last-Event-ID). Stop is POST /v1/runs/{id}/cancel: the server aborts
 * the model call and stores the partial answer as cancelled.
 */
import * as api from './api.js';
import { TurnView, Usage, el } from './turn.js';
import { renderMarkdown } from './markdown.js';
import { loadAccounts, wireAccounts } from './accounts.js';

const $ = (id) => document.getElementById(id);
const PENDING = 'loom.pending';
const RETRIES = 5;

const state = {
    conversationId: null,
    lastUserText: null,
    turns: [],      /* TurnViews of the open conversation */
    active: null,   /* {runId, conversationId, view, controller} */
    openSeq: 0,     /* bumps on each conversation switch */
    models: [],
    next: null,     /* the sidebar's next page cursor */
};

/* ---- pending runs --------------------------------------------------------- */

function pendingAll() {
    try {
        return JSON.parse(localStorage.getItem(PENDING) || '{}') || {};
    } catch {
        return {};
    }
}

function pendingSet(convId, rec) {
    const all = pendingAll();
    if (rec)
        all[convId] = rec;
    else
        delete all[convId];
    localStorage.setItem(PENDING, JSON.stringify(all));
}

/* ---- screens -------------------------------------------------------------- */

function showSignIn(message) {
    $('app').hidden = true;
    $('signin').hidden = false;
    $('signin-error').textContent = message || '';
    $('signin-key').focus();
}

function showApp() {
    $('signin').hidden = true;
    $('app').hidden = false;
    $('sign-out').hidden = !api.apiKey();
}

function showError(err) {
    $('error').textContent = err ? (err.message || String(err)) : '';
}

/* ---- models --------------------------------------------------------------- */

async function loadModels() {
    const list = await api.call('GET', '/v1/models');
    state.models = (list.data || []).map((m) => m.id);
    const sel = $('picker');
    const keep = sel.value;
    sel.replaceChildren(el('option', null, 'Default'));
    sel.firstChild.value = '';
    for (const id of state.models) {
        const o = el('option', null, id.startsWith('agent/')
            ? `Agent: ${id.slice(6)}` : id);
        o.value = id;
        sel.append(o);
    }
    sel.value = state.models.includes(keep) ? keep : '';
}

/* The run request's agent or model, from the picker and the toggle. */
function runTarget() {
    if ($('research').checked)
        return { agent: 'deep_research' };
    const v = $('picker').value;
    if (!v)
        return {};
    return v.startsWith('agent/') ? { agent: v.slice(6) } : { model: v };
}

/* ---- sidebar -------------------------------------------------------------- */

function conversationItem(c) {
    const li = el('li', 'conv');
    li.dataset.id = c.id;
    if (c.id === state.conversationId)
        li.setAttribute('aria-current', 'page');
    const title = c.title || 'Untitled';
    const link = el('a', 'conv-title', title);
    link.href = `#c=${encodeURIComponent(c.id)}`;
    const rename = el('button', 'icon', 'Rename');
    rename.type = 'button';
    rename.setAttribute('aria-label', `Rename ${title}`);
    const del = el('button', 'icon', 'Delete');
    del.type = 'button';
    del.setAttribute('aria-label', `Delete ${title}`);
    rename.addEventListener('click', () => startRename(li, c));
    del.addEventListener('click', () => deleteConversation(c));
    li.append(link, rename, del);
    return li;
}

async function loadConversations(append = false) {
    const q = $('search').value.trim();
    const params = new URLSearchParams({ limit: '50' });
    if (q)
        params.set('q', q);
    if (append && state.next)
        params.set('after', state.next);
    const list = await api.call('GET', `/v1/conversations?${params}`);
    const ul = $('conversations');
    /* A refresh keeps a title being edited as it is: the list reloads
     * when a run ends, which may be while the user types. */
    const editing = new Map();
    for (const li of ul.querySelectorAll('li'))
        if (li.querySelector('input.rename'))
            editing.set(li.dataset.id, li);
    if (!append)
        ul.replaceChildren();
    for (const c of list.data || [])
        ul.append(editing.get(c.id) || conversationItem(c));
    state.next = list.has_more ? list.next : null;
    $('more').hidden = !state.next;
}

function setTitle(convId, title) {
    if (convId === state.conversationId)
        $('chat-title').textContent = title;
    const li = document.querySelector(
        `#conversations li[data-id="${CSS.escape(convId)}"]`);
    if (li) {
        li.querySelector('.conv-title').textContent = title;
        li.querySelector('button:nth-of-type(1)')
            .setAttribute('aria-label', `Rename ${title}`);
        li.querySelector('button:nth-of-type(2)')
            .setAttribute('aria-label', `Delete ${title}`);
    }
}

function startRename(li, c) {
    const input = el('input', 'rename');
    input.type = 'text';
    input.value = c.title || '';
    input.setAttribute('aria-label', 'New title');
    const save = el('button', 'icon', 'Save');
    save.type = 'button';
    const cancel = el('button', 'icon', 'Cancel');
    cancel.type = 'button';
    li.replaceChildren(input, save, cancel);
    input.focus();
    input.select();
    const done = async (keep) => {
        if (keep && input.value.trim()) {
            try {
                const r = await api.call('PATCH',
                    `/v1/conversations/${encodeURIComponent(c.id)}`,
                    { title: input.value });
                c.title = r.title;
            } catch (err) {
                showError(err);
            }
        }
        li.replaceWith(conversationItem(c));
        if (c.id === state.conversationId)
            $('chat-title').textContent = c.title || 'Untitled';
    };
    save.addEventListener('click', () => done(true));
    cancel.addEventListener('click', () => done(false));
    input.addEventListener('keydown', (e) => {
        if (e.key === 'Enter') {
            e.preventDefault();
            done(true);
        } else if (e.key === 'Escape') {
            done(false);
        }
    });
}

async function deleteConversation(c) {
    if (!confirm(`Delete "${c.title || 'Untitled'}"?`))
        return;
    try {
        await api.call('DELETE', `/v1/conversations/${encodeURIComponent(c.id)}`);
        pendingSet(c.id, null);
        if (c.id === state.conversationId)
            newChat();
        await loadConversations();
    } catch (err) {
        showError(err);
    }
}

/* ---- the chat ------------------------------------------------------------- */

function updateTotals() {
    const total = new Usage();
    for (const t of state.turns)
        total.addUsage(t.usage);
    const p = $('totals');
    if (!total.any) {
        p.textContent = '';
        delete p.dataset.costMicros;
        return;
    }
    p.textContent = `This conversation: ${total.describe()}`;
    if (total.costKnown)
        p.dataset.costMicros = String(total.cost);
}

function setRunning(running) {
    $('send').disabled = running;
    $('stop').disabled = !running;
    $('regenerate').disabled = running || !state.lastUserText;
}

function userMessage(text) {
    const a = el('article', 'msg user');
    a.setAttribute('aria-label', 'Your message');
    const body = el('div', 'text markdown');
    renderMarkdown(body, text);
    a.append(body);
    $('log').append(a);
    return a;
}

/* The text of a stored user message. */
function userText(m) {
    return typeof m.content === 'string' ? m.content
        : (m.content || []).map((p) => p.text || '').join('');
}

function button(text, label, onClick) {
    const b = el('button', null, text);
    b.type = 'button';
    b.setAttribute('aria-label', label);
    b.addEventListener('click', onClick);
    return b;
}

/*
 * Puts the controls of stored user message m after its article a: Edit
 * (resend as a branch) and, when the message has other versions (its
 * branches, or the one it is a branch of), arrows that open them. They
 * sit beside the article, not in it, so its text stays the message's.
 */
function userControls(a, m) {
    if (!m.id || a.dataset.id)
        return;
    a.dataset.id = m.id;
    const bar = el('div', 'actions user-actions');
    const versions = Array.isArray(m.versions) ? m.versions : [];
    if (versions.length > 1) {
        const i = Number.isInteger(m.version) ? m.version : 0;
        const g = el('div', 'versions');
        g.setAttribute('role', 'group');
        g.setAttribute('aria-label', 'Versions of this message');
        const go = (k) => () => {
            location.hash = `#c=${encodeURIComponent(versions[k])}`;
        };
        const prev = button('\u2039', 'Previous version', go(i - 1));
        const next = button('\u203a', 'Next version', go(i + 1));
        prev.disabled = i === 0;
        next.disabled = i === versions.length - 1;
        g.append(prev, el('span', 'version-count',
                          `${i + 1} / ${versions.length}`), next);
        bar.append(g);
    }
    bar.append(button('Edit', 'Edit message', () => startEdit(a, bar, m)));
    a.after(bar);
}

/* Replaces the message's controls by a form to edit it; saving resends
 * it as a branch, Escape or Cancel puts things back. */
function startEdit(a, bar, m) {
    if (state.active || a.querySelector('form'))
        return;
    const form = el('form', 'edit');
    const box = el('textarea');
    box.setAttribute('aria-label', 'Edited message');
    box.rows = 3;
    box.value = userText(m);
    const save = el('button', null, 'Save edit');
    save.type = 'submit';
    const back = () => {
        form.remove();
        bar.hidden = false;
        a.querySelector('.text').hidden = false;
    };
    form.append(box, el('div', 'actions'));
    form.lastChild.append(save, button('Cancel', 'Cancel edit', back));
    form.addEventListener('submit', (e) => {
        e.preventDefault();
        if (box.value.trim() && !state.active)
            editAndResend(m, box.value);
    });
    box.addEventListener('keydown', (e) => {
        if (e.key === 'Escape')
            back();
        else if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
            e.preventDefault();
            form.requestSubmit();
        }
    });
    a.querySelector('.text').hidden = true;
    bar.hidden = true;
    a.append(form);
    box.focus();
}

/*
 * Resends an edited user message as a branch: POST
 * /v1/conversations/{id}/branches makes a conversation holding what came
 * before it, which the page opens, then the edited text runs there. The
 * original stays as it was, one arrow away.
 */
async function editAndResend(m, text) {
    let branch;
    try {
        branch = await api.call('POST', `/v1/conversations/${
            encodeURIComponent(state.conversationId)}/branches`,
        { from_message: m.id });
    } catch (err) {
        showError(err);
        return;
    }
    clearChat();
    state.conversationId = branch.id;
    history.replaceState(null, '', `#c=${encodeURIComponent(branch.id)}`);
    $('chat-title').textContent = branch.title || 'Untitled';
    drawStored(branch);
    await send(text);
}

/* Once a turn is stored, gives the open conversation's user messages
 * their controls (a message sent from this page has no id before). */
async function storedControls(convId, openSeq) {
    const conv = await api.call('GET',
                                `/v1/conversations/${encodeURIComponent(convId)}`);
    if (openSeq !== state.openSeq || state.active)
        return;
    const users = (conv.messages || []).filter((m) => m.role === 'user');
    const shown = $('log').querySelectorAll('article.msg.user');
    if (users.length !== shown.length)
        return;
    users.forEach((m, i) => userControls(shown[i], m));
}

function newTurn(convId) {
    /* POST /v1/runs/{id}/input at the top run: an approval or a form. */
    const input = (body) => api.call('POST', `/v1/runs/${
        encodeURIComponent(view.topRunId || state.active.runId)}/input`, body);
    const view = new TurnView($('log'), {
        onApprove: (ev, approve, reason) => {
            const body = { call_id: ev.call_id, approve };
            if (reason)
                body.reason = reason;
            if (ev.parent_run_id)
                body.run_id = ev.run_id;
            return input(body);
        },
        onElicit: (ev, action, content) => input(
            action === 'accept'
                ? { elicitation_id: ev.elicitation_id, action, content }
                : { elicitation_id: ev.elicitation_id, action }),
        onTitle: (title) => setTitle(convId(), title),
        onReport: downloadReport,
        onUsage: updateTotals,
    });
    state.turns.push(view);
    return view;
}

/* Saves a research run's report (GET /v1/runs/{id}/report) as a file. */
async function downloadReport(runId) {
    const text = await api.getText(
        `/v1/runs/${encodeURIComponent(runId)}/report`);
    const url = URL.createObjectURL(new Blob([text],
                                             { type: 'text/markdown' }));
    const a = el('a');
    a.href = url;
    a.download = `report-${runId}.md`;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
}

function scrollDown() {
    const log = $('log');
    log.scrollTop = log.scrollHeight;
}

/*
 * Follows the run of state.active to its end: replays from after `seq`
 * and resumes after the last event seen when the stream is cut.
 */
async function follow(active, seq) {
    let last = seq, tries = 0;
    while (!active.view.ended && tries <= RETRIES) {
        try {
            await api.followRun(active.runId, last, (ev) => {
                last = ev.seq || last;
                active.view.apply(ev);
                scrollDown();
            }, active.controller.signal);
            tries = 0;
            if (!active.view.ended)
                tries++;
        } catch (err) {
            if (active.controller.signal.aborted)
                return;
            if (err.status === 404) {
                active.view.end({ type: 'run.failed', status: 'failed',
                                  error: { message: 'the run is gone' } });
                break;
            }
            tries++;
            await new Promise((r) => setTimeout(r, 250 * tries));
        }
    }
}

function runEnded(active) {
    if (state.active !== active)
        return;
    state.active = null;
    pendingSet(active.conversationId, null);
    setRunning(false);
    loadConversations().catch(() => {});
    if (active.conversationId && active.conversationId === state.conversationId)
        storedControls(active.conversationId, state.openSeq).catch(() => {});
}

async function send(text) {
    if (state.active || !text.trim())
        return;
    showError(null);
    const openSeq = state.openSeq;
    state.lastUserText = text;
    userMessage(text);
    let convId = state.conversationId;
    const view = newTurn(() => convId);
    const active = { runId: null, conversationId: convId, view,
                     controller: new AbortController() };
    state.active = active;
    setRunning(true);
    scrollDown();
    /* An answer that asked a question is answered by its own agent. */
    const prev = state.turns[state.turns.length - 2];
    const target = prev && prev.needsInput && prev.agent
        ? { agent: prev.agent } : runTarget();
    const body = { input: text, background: true, ...target };
    if (convId)
        body.conversation_id = convId;
    else
        body.title = true;
    let last = 0;
    try {
        await api.startRun(body, ({ runId, conversationId }) => {
            active.runId = runId;
            active.conversationId = convId = conversationId;
            pendingSet(conversationId, { run: runId, input: text });
            if (state.openSeq === openSeq && !state.conversationId) {
                state.conversationId = conversationId;
                history.replaceState(null, '',
                    `#c=${encodeURIComponent(conversationId)}`);
                loadConversations().catch(() => {});
            }
        }, (ev) => {
            last = ev.seq || last;
            view.apply(ev);
            scrollDown();
        }, active.controller.signal);
        if (!view.ended && active.runId && !active.controller.signal.aborted)
            await follow(active, last);
    } catch (err) {
        if (active.runId && !active.controller.signal.aborted &&
            err.status === undefined) {
            await follow(active, last);
        } else if (!active.controller.signal.aborted) {
            view.end({ type: 'run.failed', status: 'failed',
                       error: { message: err.message } });
            showError(err);
        }
    }
    runEnded(active);
}

async function stop() {
    const active = state.active;
    if (!active || !active.runId)
        return;
    $('stop').disabled = true;
    try {
        await api.call('POST', `/v1/runs/${encodeURIComponent(active.runId)}/cancel`);
    } catch (err) {
        if (err.status !== 409)
            showError(err);
    }
}

function clearChat() {
    if (state.active) {
        state.active.controller.abort();
        state.active = null;
    }
    state.openSeq++;
    state.turns = [];
    state.lastUserText = null;
    $('log').replaceChildren();
    updateTotals();
    showError(null);
    setRunning(false);
}

function newChat() {
    clearChat();
    state.conversationId = null;
    $('chat-title').textContent = 'New chat';
    history.replaceState(null, '', location.pathname);
    for (const li of document.querySelectorAll('#conversations li'))
        li.removeAttribute('aria-current');
    $('message').focus();
}

/* Draws a stored conversation: one user message and one answer a turn. */
function drawStored(conv) {
    const byRun = new Map();
    for (const u of conv.usage || []) {
        if (!byRun.has(u.run_id))
            byRun.set(u.run_id, []);
        byRun.get(u.run_id).push(u);
    }
    let answer = [];
    const flush = () => {
        if (!answer.length)
            return;
        const view = newTurn(() => conv.id);
        const runId = answer.find((m) => m.run_id)?.run_id;
        view.fromStored(answer, byRun.get(runId) || []);
        answer = [];
    };
    for (const m of conv.messages || []) {
        if (m.role === 'user') {
            flush();
            const text = userText(m);
            userControls(userMessage(text), m);
            state.lastUserText = text;
        } else if (m.role === 'assistant' || m.role === 'tool') {
            answer.push(m);
        }
    }
    flush();
    updateTotals();
}

async function openConversation(id) {
    clearChat();
    const openSeq = state.openSeq;
    state.conversationId = id;
    for (const li of document.querySelectorAll('#conversations li')) {
        if (li.dataset.id === id)
            li.setAttribute('aria-current', 'page');
        else
            li.removeAttribute('aria-current');
    }
    let conv;
    try {
        conv = await api.call('GET', `/v1/conversations/${encodeURIComponent(id)}`);
    } catch (err) {
        if (openSeq !== state.openSeq)
            return;
        if (err.status !== 404 || !pendingAll()[id]) {
            showError(err);
            return;
        }
        conv = { id, title: 'New chat', messages: [] }; /* not stored yet */
    }
    if (openSeq !== state.openSeq)
        return;
    $('chat-title').textContent = conv.title || 'Untitled';
    drawStored(conv);
    setRunning(false);
    await reattach(id, openSeq);
}

/* Follows the run the conversation waits for, if it still runs. */
async function reattach(convId, openSeq) {
    const rec = pendingAll()[convId];
    if (!rec)
        return;
    let run;
    try {
        run = await api.call('GET', `/v1/runs/${encodeURIComponent(rec.run)}`);
    } catch {
        run = null;
    }
    if (openSeq !== state.openSeq)
        return;
    if (!run || run.status !== 'running') {
        pendingSet(convId, null);
        if (run)
            await openConversation(convId); /* its turn is stored now */
        return;
    }
    state.lastUserText = rec.input;
    userMessage(rec.input);
    const view = newTurn(() => convId);
    const active = { runId: rec.run, conversationId: convId, view,
                     controller: new AbortController() };
    state.active = active;
    setRunning(true);
    await follow(active, 0);
    runEnded(active);
}

function route() {
    const m = /^#c=(.+)$/.exec(location.hash);
    if (m)
        openConversation(decodeURIComponent(m[1]));
    else
        newChat();
}

/* ---- wiring --------------------------------------------------------------- */

function wire() {
    $('composer').addEventListener('submit', (e) => {
        e.preventDefault();
        const text = $('message').value;
        if (!text.trim() || state.active)
            return;
        $('message').value = '';
        send(text);
    });
    $('message').addEventListener('keydown', (e) => {
        if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
            e.preventDefault();
            $('composer').requestSubmit();
        }
    });
    $('stop').addEventListener('click', stop);
    $('regenerate').addEventListener('click', () => {
        if (state.lastUserText)
            send(state.lastUserText);
    });
    $('new-chat').addEventListener('click', newChat);
    let searchTimer = 0;
    $('search').addEventListener('input', () => {
        clearTimeout(searchTimer);
        searchTimer = setTimeout(() => loadConversations().catch(showError),
                                 200);
    });
    $('more').addEventListener('click', () =>
        loadConversations(true).catch(showError));
    window.addEventListener('hashchange', route);
    $('sign-out').addEventListener('click', () => {
        api.setApiKey('');
        location.hash = '';
        location.reload();
    });
    $('signin-form').addEventListener('submit', async (e) => {
        e.preventDefault();
        api.setApiKey($('signin-key').value.trim());
        $('signin-key').value = '';
        await start();
    });
}

async function start() {
    try {
        await loadModels();
    } catch (err) {
        if (err.status === 401) {
            showSignIn(api.apiKey() ? 'That key was not accepted.' : '');
            return;
        }
        showApp();
        showError(err);
        return;
    }
    /* The chat shows once it is in place: route() clears the log. */
    await loadConversations().catch(showError);
    route();
    showApp();
    await loadAccounts();
}

api.setUnauthorizedHandler(() => showSignIn('Please sign in again.'));
wire();
wireAccounts();
start();

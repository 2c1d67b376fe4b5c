/*
 * turn.js: one answer of the assistant, drawn from a run's event stream
 * (docs/events.md) as it comes, or from the stored messages of a
 * conversation (GET /v1/conversations/{id}).
 *
 * An answer is a flow of blocks in the order they happened: reasoning
 * (collapsible), text (Markdown, sanitised), tool cards (name, arguments,
 * running/done/failed, duration, collapsible output), the plan, review
 * notes, handoffs, approval forms and the forms MCP servers ask to fill
 * in (forms.js); then the citations as numbered links
 * and a footer with the model, the agent, tokens and cost. A sub-agent's
 * events (those with parent_call_id) draw a nested flow inside the card
 * of the call that started it. Everything from the model or a tool is
 * put in the page as text, or as Markdown through markdown.js: never as
 * HTML of its own.
 */
import { elicitationForm } from './forms.js';
import { renderMarkdown } from './markdown.js';

/* document.createElement with a class and text content. */
export function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls)
        e.className = cls;
    if (text !== undefined && text !== null)
        e.textContent = String(text);
    return e;
}

/* A button with text, of type (button, submit). */
export function button(text, type = 'button') {
    const b = el('button', null, text);
    b.type = type;
    return b;
}

/* A paragraph announced to screen readers as it changes. */
export function statusLine() {
    const p = el('p', 'said');
    p.setAttribute('role', 'status');
    return p;
}

export function formatCost(micros) {
    if (micros === null || micros === undefined)
        return null;
    return `$${(micros / 1e6).toFixed(6)}`;
}

function pretty(v) {
    if (typeof v === 'string') {
        try {
            return JSON.stringify(JSON.parse(v), null, 2);
        } catch {
            return v;
        }
    }
    return JSON.stringify(v, null, 2);
}

/* Token and cost totals; add() takes a usage object of an event. */
export class Usage {
    constructor() {
        this.prompt = 0;
        this.completion = 0;
        this.cached = 0;
        this.reasoning = 0;
        this.cost = 0;
        this.costKnown = true;
        this.any = false;
    }

    add(u) {
        if (!u)
            return;
        this.any = true;
        this.prompt += u.prompt_tokens || 0;
        this.completion += u.completion_tokens || 0;
        this.cached += u.cached_tokens || 0;
        this.reasoning += u.reasoning_tokens || 0;
        if (Number.isInteger(u.cost_micros))
            this.cost += u.cost_micros;
        else
            this.costKnown = false;
    }

    set(u) {
        const fresh = new Usage();
        fresh.add(u);
        Object.assign(this, fresh);
    }

    addUsage(o) {
        if (!o.any)
            return;
        this.any = true;
        this.prompt += o.prompt;
        this.completion += o.completion;
        this.cached += o.cached;
        this.reasoning += o.reasoning;
        this.cost += o.cost;
        this.costKnown = this.costKnown && o.costKnown;
    }

    /* "12 in · 5 out · 3 cached · $0.000042" */
    describe() {
        const parts = [`${this.prompt} in`, `${this.completion} out`];
        if (this.cached)
            parts.push(`${this.cached} cached`);
        if (this.reasoning)
            parts.push(`${this.reasoning} reasoning`);
        if (this.costKnown)
            parts.push(formatCost(this.cost));
        return parts.join(' · ');
    }
}

/* The flow of one run (the top run or a sub-agent's). */
class Flow {
    constructor(root, turn) {
        this.root = root;
        this.turn = turn;
        this.last = null; /* {kind, el} of the last block */
        this.text = '';
    }

    block(kind, make) {
        if (this.last && this.last.kind === kind)
            return this.last;
        this.last = { kind, el: make(), text: '' };
        this.root.append(this.last.el);
        return this.last;
    }

    appendText(delta) {
        const b = this.block('text', () => el('div', 'text markdown'));
        b.text += delta;
        this.text += delta;
        this.turn.schedule(() => renderMarkdown(b.el, b.text));
    }

    /* A collapsed block of reasoning (or of the research plan). */
    appendReasoning(delta, title = 'Reasoning') {
        const b = this.block(title, () => {
            const d = el('details', title === 'Reasoning' ? 'reasoning'
                                                          : 'reasoning plan-text');
            d.append(el('summary', null, title), el('div', 'body'));
            return d;
        });
        b.text += delta;
        b.el.querySelector('.body').textContent = b.text;
        if (!delta && !b.text)
            b.el.hidden = true;
        else
            b.el.hidden = false;
    }

    /* A breaking block: the next text starts a new text block. */
    put(node) {
        this.root.append(node);
        this.last = { kind: 'other', el: node };
    }
}

export class TurnView {
    /*
     * container: where the answer goes. opts.onApprove(event, approve,
     * reason) answers an approval, opts.onElicit(event, action, content)
     * a form of an mcp.elicitation event (both return a promise).
     */
    constructor(container, opts = {}) {
        this.opts = opts;
        this.article = el('article', 'msg assistant');
        this.article.setAttribute('aria-label', 'Answer');
        this.status = el('p', 'status');
        this.status.setAttribute('role', 'status');
        const flowRoot = el('div', 'flow');
        this.citations = el('ol', 'citations');
        this.citations.hidden = true;
        this.footer = el('footer', 'meta');
        this.copyBtn = el('button', 'copy', 'Copy');
        this.copyBtn.type = 'button';
        this.copyBtn.setAttribute('aria-label', 'Copy answer');
        this.copyBtn.addEventListener('click', () => this.copy());
        this.metaText = el('span', 'meta-text');
        this.footer.append(this.metaText, this.copyBtn);
        this.article.append(flowRoot, this.citations, this.status, this.footer);
        container.append(this.article);
        this.flows = new Map(); /* run id -> Flow */
        this.top = new Flow(flowRoot, this);
        this.topRunId = null;
        this.cards = new Map(); /* "<run id>:<call id>" -> card */
        this.forms = new Map(); /* "<run id>:<call id>" -> open form */
        this.usage = new Usage();
        this.model = null;
        this.agent = null;
        this.finalText = null;
        this.ended = false;
        this.needsInput = false; /* ended asking the user a question */
        this.pending = new Set();
        this.raf = 0;
    }

    /* Runs fn at the next frame (once per frame per fn). */
    schedule(fn) {
        this.pending.add(fn);
        if (!this.raf)
            this.raf = requestAnimationFrame(() => this.flush());
    }

    flush() {
        this.raf = 0;
        const fns = [...this.pending];
        this.pending.clear();
        for (const fn of fns)
            fn();
    }

    flowOf(ev) {
        const rid = ev.run_id;
        if (!rid || rid === this.topRunId || !ev.parent_run_id)
            return this.top;
        let f = this.flows.get(rid);
        if (f)
            return f;
        const card = this.cards.get(`${ev.parent_run_id}:${ev.parent_call_id}`);
        const box = el('section', 'subagent');
        box.setAttribute('aria-label', `Sub-agent ${ev.agent || ''}`.trim());
        const head = el('div', 'sub-head');
        head.append(el('span', 'sub-agent-name', ev.agent || 'sub-agent'),
                    el('span', 'badge running', 'running'));
        const root = el('div', 'flow');
        box.append(head, root);
        if (card)
            card.sub.append(box);
        else
            this.top.put(box);
        f = new Flow(root, this);
        f.box = box;
        this.flows.set(rid, f);
        return f;
    }

    card(flow, runId, id, name, args) {
        const key = `${runId}:${id}`;
        let c = this.cards.get(key);
        if (c)
            return c;
        const d = el('details', 'tool');
        const sum = el('summary');
        const badge = el('span', 'badge running', 'running');
        const dur = el('span', 'duration');
        sum.append(el('span', 'tool-name', name), badge, dur);
        if (name === 'research_agent') {
            /* A deep research run's researcher: named by its task. */
            let task = args;
            try {
                task = (typeof args === 'string' ? JSON.parse(args) : args).task;
            } catch {
                /* arguments still partial: keep them */
            }
            sum.firstChild.textContent = 'Researcher';
            sum.insertBefore(el('span', 'task', task), badge);
            d.classList.add('researcher');
        }
        const sources = el('span', 'sources');
        const argsPre = el('pre', 'args', pretty(args));
        const out = el('pre', 'output');
        out.hidden = true;
        const sub = el('div', 'subs');
        const outLabel = el('div', 'label', 'Output');
        outLabel.hidden = true;
        if (d.classList.contains('researcher'))
            sum.append(sources);
        d.append(sum, el('div', 'label', 'Arguments'), argsPre, sub, outLabel,
                 out);
        d.dataset.status = 'running';
        d.dataset.tool = name;
        c = { d, badge, dur, argsPre, out, outLabel, sub, streamed: '',
              sources, documents: new Set() };
        this.countSources(c, []);
        this.cards.set(key, c);
        flow.put(d);
        return c;
    }

    /* Adds ids to the documents a researcher's card counts. */
    countSources(c, ids) {
        if (!c.d.classList.contains('researcher'))
            return;
        for (const id of ids)
            c.documents.add(id);
        const n = c.documents.size;
        c.sources.textContent = `${n} ${n === 1 ? 'source' : 'sources'}`;
        c.d.dataset.sources = String(n);
    }

    setCardStatus(c, status, label) {
        c.d.dataset.status = status;
        c.badge.className = `badge ${status}`;
        c.badge.textContent = label;
    }

    finishCard(c, ok, ev) {
        const status = ok ? 'done' : 'failed';
        this.setCardStatus(c, status, status);
        if (typeof ev.duration_ms === 'number')
            c.dur.textContent = `${Math.round(ev.duration_ms)} ms`;
        const text = ok ? ev.output : (ev.error || ev.output);
        c.out.textContent = text === undefined || text === null
            ? c.streamed : String(text);
        c.out.hidden = c.outLabel.hidden = false;
    }

    /* Applies one event of the run's stream. */
    apply(ev) {
        const flow = this.flowOf(ev);
        const nested = flow !== this.top;
        switch (ev.type) {
        case 'run.started':
            if (!nested) {
                this.topRunId = this.topRunId || ev.run_id;
                this.model = ev.model;
                this.agent = ev.agent;
                this.setStatus('Answering…');
                this.renderMeta();
            }
            break;
        case 'message.delta':
            flow.appendText(ev.delta || '');
            break;
        case 'reasoning.delta':
            flow.appendReasoning(ev.delta || '');
            break;
        case 'research.plan':
            flow.appendReasoning(ev.delta || '', 'Research plan');
            break;
        case 'tool_calls':
            for (const call of ev.calls || [])
                this.card(flow, ev.run_id, call.id, call.name, call.arguments);
            break;
        case 'tool.started':
            this.setCardStatus(
                this.card(flow, ev.run_id, ev.id, ev.name, ev.arguments),
                'running', 'running');
            break;
        case 'tool.delta': {
            const c = this.cards.get(`${ev.run_id}:${ev.call_id}`);
            if (c && !c.sub.childElementCount) {
                c.streamed += ev.delta || '';
                c.out.textContent = c.streamed;
                c.out.hidden = c.outLabel.hidden = false;
            }
            break;
        }
        case 'tool.progress': {
            const c = this.cards.get(`${ev.run_id}:${ev.call_id}`);
            if (c)
                c.dur.textContent = ev.label || '';
            break;
        }
        case 'tool.completed':
        case 'tool.failed': {
            const c = this.card(flow, ev.run_id, ev.id, ev.name, {});
            this.finishCard(c, ev.type === 'tool.completed', ev);
            this.closeForm(`${ev.run_id}:${ev.id}`,
                           'The call went on without an answer here.');
            break;
        }
        case 'tool.metric': {
            /* What a researcher found: the documents of its own calls as
             * they end, then those its research_agent call added. */
            const c = this.cards.get(ev.tool === 'research_agent'
                ? `${ev.run_id}:${ev.call_id}`
                : `${ev.parent_run_id}:${ev.parent_call_id}`);
            if (c)
                this.countSources(c, ev.documents || []);
            break;
        }
        case 'approval.required': {
            const c = this.cards.get(`${ev.run_id}:${ev.call_id}`);
            if (c)
                this.setCardStatus(c, 'waiting', 'waiting for approval');
            flow.put(this.approvalForm(ev));
            break;
        }
        case 'mcp.elicitation': {
            const key = `${ev.run_id}:${ev.call_id}`;
            const c = this.cards.get(key);
            if (c)
                this.setCardStatus(c, 'waiting', 'waiting for input');
            const f = elicitationForm(ev, async (action, content) => {
                await this.opts.onElicit(ev, action, content);
                this.forms.delete(key);
                if (c && c.d.dataset.status === 'waiting')
                    this.setCardStatus(c, 'running', 'running');
            });
            this.closeForm(key, 'Asked again below.');
            this.forms.set(key, f);
            flow.put(f.form);
            break;
        }
        case 'plan.updated':
            flow.put(this.planView(ev.plan || {}));
            break;
        case 'review':
            if (ev.status === 'ok' && (ev.note || (ev.gaps || []).length))
                flow.put(el('p', 'review',
                            `Review: ${ev.note || ''} ${
                                (ev.gaps || []).join('; ')}`.trim()));
            break;
        case 'agent.changed':
            flow.put(el('p', 'handoff',
                        `Handed over from ${ev.from} to ${ev.to}` +
                        (ev.reason ? `: ${ev.reason}` : '')));
            if (!nested) {
                this.agent = ev.to;
                this.renderMeta();
            }
            break;
        case 'research.cycle':
            flow.put(el('p', 'research-cycle',
                        `Research cycle ${ev.cycle} of ${ev.max_cycles}`));
            break;
        case 'citation':
            if (!nested)
                this.addCitation(ev);
            break;
        case 'usage':
            this.usage.add(ev);
            if (ev.model && !nested)
                this.model = ev.model;
            this.renderMeta();
            break;
        case 'conversation.title':
            if (this.opts.onTitle)
                this.opts.onTitle(ev.title);
            break;
        case 'run.completed':
        case 'run.failed':
            if (nested)
                this.endSub(flow, ev);
            else
                this.end(ev);
            break;
        default:
            break;
        }
    }

    endSub(flow, ev) {
        const badge = flow.box.querySelector('.sub-head .badge');
        const s = ev.type === 'run.completed' ? 'done'
                  : ev.status === 'cancelled' ? 'stopped' : 'failed';
        badge.className = `badge ${s}`;
        badge.textContent = s;
    }

    end(ev) {
        this.ended = true;
        this.flush();
        if (ev.usage)
            this.usage.set(ev.usage);
        if (ev.model)
            this.model = ev.model;
        this.finalText = typeof ev.text === 'string' ? ev.text : this.top.text;
        if (ev.research && ev.research.researchers !== undefined)
            this.researchSummary(ev);
        this.needsInput = ev.status === 'needs_input';
        if (this.needsInput) {
            /* A research run's clarifying question: the text above. */
            this.setStatus('Waiting for your answer: your next message ' +
                           'answers the question.');
            this.article.dataset.status = 'needs_input';
        } else if (ev.type === 'run.completed') {
            this.setStatus('');
            this.article.dataset.status = 'completed';
        } else if (ev.status === 'cancelled') {
            this.setStatus('Stopped');
            this.article.dataset.status = 'cancelled';
        } else {
            const err = ev.error || {};
            this.setStatus(`Failed: ${err.message || err.code || 'error'}`);
            this.article.dataset.status = 'failed';
        }
        for (const key of [...this.forms.keys()])
            this.closeForm(key, 'The run ended without an answer here.');
        for (const c of this.cards.values()) {
            if (c.d.dataset.status === 'running' ||
                c.d.dataset.status === 'waiting')
                this.setCardStatus(c, 'stopped', 'stopped');
        }
        this.renderMeta();
    }

    /* A research run's outcome and its report as a Markdown file. */
    researchSummary(ev) {
        const r = ev.research;
        const box = el('section', 'research-summary');
        box.setAttribute('aria-label', 'Research');
        box.append(el('p', null,
                      `Research: ${r.cycles} of at most ${r.max_cycles} ` +
                      `cycles, ${r.researchers} researchers, ${r.failed} ` +
                      'failed'));
        if (ev.type === 'run.completed' && this.opts.onReport) {
            const b = el('button', null, 'Download report');
            b.type = 'button';
            b.addEventListener('click', () => this.opts.onReport(this.topRunId)
                .catch((err) => { b.textContent = `Failed: ${err.message}`; }));
            box.append(b);
        }
        this.top.put(box);
    }

    /* Ends the open form of the call key, if any, saying text. */
    closeForm(key, text) {
        const f = this.forms.get(key);
        if (f) {
            f.close(text);
            this.forms.delete(key);
        }
    }

    setStatus(text) {
        this.status.textContent = text;
        this.status.hidden = !text;
    }

    renderMeta() {
        const parts = [];
        if (this.model)
            parts.push(this.model);
        if (this.agent)
            parts.push(`agent ${this.agent}`);
        if (this.usage.any)
            parts.push(this.usage.describe());
        this.metaText.textContent = parts.join(' · ');
        if (this.usage.any && this.usage.costKnown)
            this.article.dataset.costMicros = String(this.usage.cost);
        if (this.opts.onUsage)
            this.opts.onUsage();
    }

    addCitation(ev) {
        this.citations.hidden = false;
        const li = el('li');
        li.value = ev.number;
        const label = ev.title || ev.url || `Source ${ev.number}`;
        if (ev.url && /^https?:\/\//i.test(ev.url)) {
            const a = el('a', null, label);
            a.href = ev.url;
            a.target = '_blank';
            a.rel = 'noopener noreferrer';
            li.append(a);
        } else {
            li.textContent = label;
        }
        this.citations.append(li);
    }

    planView(plan) {
        const box = el('section', 'plan');
        box.setAttribute('aria-label', 'Plan');
        if (plan.goal)
            box.append(el('p', 'goal', plan.goal));
        const ol = el('ol');
        for (const t of plan.tasks || []) {
            const li = el('li', `task ${t.status || ''}`);
            li.append(el('span', 'task-status', t.status || 'pending'),
                      el('span', 'task-text', t.description || ''));
            ol.append(li);
        }
        box.append(ol);
        return box;
    }

    approvalForm(ev) {
        const form = el('form', 'approval');
        form.setAttribute('aria-label', `Approve ${ev.tool}`);
        form.append(el('p', null, `${ev.tool} asks to run with:`),
                    el('pre', 'args', pretty(ev.arguments)));
        const reason = el('input');
        reason.type = 'text';
        reason.setAttribute('aria-label', 'Reason');
        reason.placeholder = 'Reason (for a denial)';
        const yes = button('Approve');
        const no = button('Deny');
        const said = statusLine();
        form.append(reason, yes, no, said);
        const answer = async (approve) => {
            yes.disabled = no.disabled = reason.disabled = true;
            try {
                await this.opts.onApprove(ev, approve, reason.value);
                said.textContent = approve ? 'Approved' : 'Denied';
            } catch (err) {
                said.textContent = `Could not answer: ${err.message}`;
                yes.disabled = no.disabled = reason.disabled = false;
            }
        };
        yes.addEventListener('click', () => answer(true));
        no.addEventListener('click', () => answer(false));
        form.addEventListener('submit', (e) => e.preventDefault());
        return form;
    }

    async copy() {
        const text = this.finalText ?? this.top.text;
        try {
            await navigator.clipboard.writeText(text);
            this.copyBtn.textContent = 'Copied';
        } catch {
            this.copyBtn.textContent = 'Copy failed';
        }
        setTimeout(() => { this.copyBtn.textContent = 'Copy'; }, 1500);
    }

    /*
     * Draws a stored turn: msgs are its assistant and tool messages in
     * order (GET /v1/conversations/{id}), usage its usage rows.
     */
    fromStored(msgs, usageRows) {
        const calls = new Map();
        let last = null;
        for (const m of msgs) {
            if (m.role === 'assistant') {
                last = m;
                if (m.reasoning)
                    this.top.appendReasoning(m.reasoning);
                if (m.content)
                    this.top.appendText(m.content);
                for (const c of m.tool_calls || [])
                    calls.set(c.id, this.card(this.top, 'stored', c.id, c.name,
                                              c.arguments));
                this.model = m.model || this.model;
                this.agent = m.agent || this.agent;
                for (const cite of m.citations || [])
                    this.addCitation(cite);
            } else if (m.role === 'tool') {
                const c = calls.get(m.tool_call_id) ||
                    this.card(this.top, 'stored', m.tool_call_id, m.name, {});
                this.finishCard(c, m.tool_status !== 'error' &&
                                   m.tool_status !== 'failed', {
                    duration_ms: m.duration_ms, output: m.content,
                    error: m.content });
            }
        }
        for (const u of usageRows)
            this.usage.add(u);
        this.flush();
        this.finalText = last ? last.content || '' : '';
        const status = last ? last.status : null;
        this.end({ type: status === 'cancelled' || status === 'failed'
                         ? 'run.failed' : 'run.completed',
                   status, text: this.finalText,
                   error: last && last.error ? { message: last.error } : null });
    }
}

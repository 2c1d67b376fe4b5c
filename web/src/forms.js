/*
 * forms.js: the form an MCP server asks a person to fill in during a tool
 * call (an `mcp.elicitation` event, docs/mcp.md "Elicitation"), drawn
 * from its requestedSchema: a flat object of string, number, integer,
 * boolean and enum fields, each with a visible label (the field's title,
 * else its name) and its description. The server's message and every
 * title, description and choice are untrusted: they go in the page as
 * text only.
 *
 * Submit sends {action: "accept", content} with the fields filled in (the
 * browser first checks required fields, lengths and bounds); Decline and
 * Cancel send that action alone. loom checks the content against the
 * schema again, and its refusal is shown so the form can be fixed and
 * sent again.
 */
import { button, el, statusLine } from './turn.js';

let nextId = 0;

/* The choices of an enum field: [{value, label}], or null. */
function choices(prop) {
    if (Array.isArray(prop.enum))
        return prop.enum.map((v, i) => ({
            value: String(v),
            label: String((prop.enumNames || [])[i] ?? v),
        }));
    if (Array.isArray(prop.oneOf) &&
        prop.oneOf.every((o) => o && o.const !== undefined))
        return prop.oneOf.map((o) => ({ value: String(o.const),
                                        label: String(o.title ?? o.const) }));
    return null;
}

/* One field: {row, read()} where read() gives its value or undefined. */
function field(name, prop, required) {
    const id = `form-field-${++nextId}`;
    const row = el('div', 'field');
    const label = el('label', null, prop.title || name);
    label.htmlFor = id;
    if (required)
        label.append(el('span', 'required', ' (required)'));
    let input;
    let read;
    const opts = choices(prop);
    if (opts) {
        input = el('select');
        if (!required || prop.default === undefined)
            input.append(el('option', null, ''));
        for (const o of opts) {
            const option = el('option', null, o.label);
            option.value = o.value;
            input.append(option);
        }
        if (prop.default !== undefined)
            input.value = String(prop.default);
        read = () => input.value === '' ? undefined : input.value;
    } else if (prop.type === 'boolean') {
        input = el('input');
        input.type = 'checkbox';
        input.checked = prop.default === true;
        read = () => input.checked;
    } else if (prop.type === 'number' || prop.type === 'integer') {
        input = el('input');
        input.type = 'number';
        input.step = prop.type === 'integer' ? '1' : 'any';
        if (typeof prop.minimum === 'number')
            input.min = String(prop.minimum);
        if (typeof prop.maximum === 'number')
            input.max = String(prop.maximum);
        if (typeof prop.default === 'number')
            input.value = String(prop.default);
        read = () => input.value === '' ? undefined : Number(input.value);
    } else {
        input = el('input');
        input.type = { email: 'email', uri: 'url', date: 'date' }[prop.format] ||
            'text';
        if (Number.isInteger(prop.minLength))
            input.minLength = prop.minLength;
        if (Number.isInteger(prop.maxLength))
            input.maxLength = prop.maxLength;
        if (typeof prop.default === 'string')
            input.value = prop.default;
        read = () => input.value === '' ? undefined : input.value;
    }
    input.id = id;
    input.name = name;
    input.required = required && prop.type !== 'boolean';
    row.append(label, input);
    if (prop.description) {
        const help = el('span', 'help', prop.description);
        help.id = `${id}-help`;
        input.setAttribute('aria-describedby', help.id);
        row.append(help);
    }
    return { row, input, read };
}

/*
 * The form for ev (an mcp.elicitation event). answer(action, content)
 * sends the answer (a promise; a rejection's message is shown and the
 * form may be answered again). Returns {form, close(text)}: close ends a
 * form nobody answered (its call went on or the run ended) with text.
 */
export function elicitationForm(ev, answer) {
    const schema = ev.requestedSchema || {};
    const required = new Set(Array.isArray(schema.required)
        ? schema.required : []);
    const form = el('form', 'elicitation');
    form.setAttribute('aria-label', `Form from ${ev.server || 'a tool'}`);
    form.append(el('p', 'asker', `${ev.server || 'A tool'} asks:`),
                el('p', 'message', ev.message || ''));
    const fields = Object.entries(schema.properties || {}).map(
        ([name, prop]) => ({ name, ...field(name, prop || {},
                                            required.has(name)) }));
    for (const f of fields)
        form.append(f.row);
    const submit = button('Submit', 'submit');
    const decline = button('Decline');
    const cancel = button('Cancel');
    const said = statusLine();
    const buttons = el('div', 'buttons');
    buttons.append(submit, decline, cancel);
    form.append(buttons, said);
    const controls = [submit, decline, cancel, ...fields.map((f) => f.input)];
    let done = false;
    const lock = (locked) => {
        for (const c of controls)
            c.disabled = locked;
    };
    const send = async (action, content) => {
        lock(true);
        try {
            await answer(action, content);
            done = true;
            form.dataset.answered = action;
            said.textContent = { accept: 'Sent', decline: 'Declined',
                                 cancel: 'Cancelled' }[action];
        } catch (err) {
            said.textContent = `Could not answer: ${err.message}`;
            lock(false);
        }
    };
    form.addEventListener('submit', (e) => {
        e.preventDefault();
        const content = {};
        for (const f of fields) {
            const v = f.read();
            if (v !== undefined)
                content[f.name] = v;
        }
        send('accept', content);
    });
    decline.addEventListener('click', () => send('decline'));
    cancel.addEventListener('click', () => send('cancel'));
    return {
        form,
        close(text) {
            if (done)
                return;
            done = true;
            lock(true);
            said.textContent = text;
        },
    };
}

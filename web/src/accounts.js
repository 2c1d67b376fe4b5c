/*
 * accounts.js: the sidebar's "MCP accounts" section (docs/ui.md,
 * docs/mcp.md "Connecting your own account"): the MCP servers that take
 * the signed-in user's own account (GET /v1/me/mcp), each connected or
 * not, with Connect and Disconnect. Connect asks loom for an
 * authorization URL (POST /v1/me/mcp/{server}/connect) and opens it in a
 * new tab (this one when the browser blocks it); the authorization
 * server sends that tab back to loom, which says connected. The list is
 * read again when this page gets the focus back. Server names are shown
 * as text only.
 */
import * as api from './api.js';
import { button, el } from './turn.js';

const $ = (id) => document.getElementById(id);

function row(server, onChange) {
    const li = el('li', 'account');
    const name = el('span', 'account-name', server.name);
    const status = el('span', 'account-status',
                      server.connected ? 'Connected' : 'Not connected');
    li.append(name, status);
    li.dataset.server = server.name;
    if (server.auth !== 'oauth') {
        /* Secrets come from the user's settings: nothing to click. */
        status.textContent = server.connected ? 'Connected (your secrets)'
                                              : 'Needs your secrets';
        return li;
    }
    const path = `/v1/me/mcp/${encodeURIComponent(server.name)}`;
    const b = button(server.connected ? 'Disconnect' : 'Connect');
    b.setAttribute('aria-label', `${b.textContent} ${server.name}`);
    b.addEventListener('click', async () => {
        let tab = null;
        b.disabled = true;
        try {
            if (server.connected) {
                await api.call('DELETE', path);
            } else {
                /* Opened now, while the click still allows it. */
                tab = window.open('', '_blank');
                const got = await api.call('POST', `${path}/connect`);
                if (got.authorization_url) {
                    if (tab) {
                        tab.opener = null;
                        tab.location.href = got.authorization_url;
                    } else {
                        location.assign(got.authorization_url);
                    }
                } else if (tab) {
                    tab.close();
                }
            }
            await onChange();
        } catch (err) {
            if (tab)
                tab.close();
            status.textContent = err.message;
        } finally {
            b.disabled = false;
        }
    });
    li.append(b);
    return li;
}

/* Reads the list again and draws it; hides the section when empty. */
export async function loadAccounts() {
    const box = $('accounts');
    const list = $('account-list');
    let got;
    try {
        got = await api.call('GET', '/v1/me/mcp');
    } catch {
        box.hidden = true;
        return;
    }
    const servers = (got && got.data) || [];
    list.replaceChildren(...servers.map((s) => row(s, loadAccounts)));
    box.hidden = servers.length === 0;
}

export function wireAccounts() {
    window.addEventListener('focus', () => {
        if (!$('app').hidden)
            loadAccounts();
    });
}

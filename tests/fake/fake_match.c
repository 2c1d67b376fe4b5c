/*
 * loom-fake-upstream's rule matching: a script's "rules" answer requests
 * by what they contain rather than by their arrival order, because
 * parallel sub-agent runs call the fake in no fixed order. This file reads
 * a rule's "match" object and tests a request body against it. The body is
 * first reduced to what every wire format has (the system prompt, the
 * messages as role and text, the offered tool names), recognised by its
 * shape: "contents" (Gemini), "input" (OpenAI Responses), "messages"
 * (OpenAI Chat Completions, Anthropic Messages). fake_script.c keeps each
 * rule's cursor.
 */
#include "fake_upstream.h"

#include <stdlib.h>
#include <string.h>

static const char *const match_keys[] = {
    "first_user", "any_message", "last_message",
    "system",     "tools",       "tools_include",
};

/* A request reduced to what the rules look at. */
typedef struct {
    json_t *system; /* the system prompt's pieces, strings */
    json_t *msgs;   /* [{"role", "text"}] in order, system messages out */
    json_t *tools;  /* names of the offered tools */
} req_view;

/* Appends string s to the pieces of a text, after a "\n" when it is not
 * the first; the pieces are joined with fake_join. */
static void add_piece(json_t *pieces, json_t *s)
{
    if ((json_array_size(pieces) &&
         json_array_append_new(pieces, json_string("\n"))) ||
        json_array_append_new(pieces, s))
        fake_die("out of memory");
}

/*
 * Appends the text of a message's content in any format: a string; an
 * array of parts; a part's "text", "content" (Anthropic tool_result),
 * "output" (Responses function_call_output), "parts" and a Gemini
 * functionResponse's "response" (as compact JSON). Parts are separated
 * by a newline.
 */
static void add_text(json_t *b, json_t *v)
{
    static const char *const keys[] = {"text", "content", "output", "parts"};
    json_t *e;
    size_t i;

    if (json_is_string(v)) {
        add_piece(b, json_incref(v));
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, e)
        {
            add_text(b, e);
        }
    } else if (json_is_object(v)) {
        for (i = 0; i < sizeof(keys) / sizeof(*keys); i++)
            add_text(b, json_object_get(v, keys[i]));
        e = json_object_get(json_object_get(v, "functionResponse"), "response");
        if (e) {
            char *js = json_dumps(e, JSON_COMPACT);

            if (!js)
                fake_die("out of memory");
            add_piece(b, json_string(js));
            free(js);
        }
    }
}

static bool is_system_role(const char *role)
{
    return role && (!strcmp(role, "system") || !strcmp(role, "developer"));
}

/* Adds one message (or, for a system role, its text to the prompt). */
static void view_add(req_view *v, const char *role, json_t *content)
{
    json_t *pieces;

    if (is_system_role(role)) {
        add_text(v->system, content);
        return;
    }
    pieces = json_array();
    if (!pieces)
        fake_die("out of memory");
    add_text(pieces, content);
    if (json_array_append_new(v->msgs,
                              json_pack("{s:s,s:o*}", "role", role ? role : "",
                                        "text", fake_join(pieces, NULL, 0))))
        fake_die("out of memory");
    json_decref(pieces);
}

static void view_tools(req_view *v, json_t *tools)
{
    json_t *t, *d, *name;
    size_t i, k;

    json_array_foreach(tools, i, t)
    {
        name = json_object_get(t, "name");
        if (!name)
            name = json_object_get(json_object_get(t, "function"), "name");
        if (json_is_string(name))
            json_array_append(v->tools, name);
        d = json_object_get(t, "functionDeclarations");
        if (!d)
            d = json_object_get(t, "function_declarations");
        json_array_foreach(d, k, name)
        {
            name = json_object_get(name, "name");
            if (json_is_string(name))
                json_array_append(v->tools, name);
        }
    }
}

static void view_init(req_view *v, json_t *body)
{
    json_t *arr, *m, *sys;
    size_t i;

    v->system = json_array();
    v->msgs = json_array();
    v->tools = json_array();
    if (!v->system || !v->msgs || !v->tools)
        fake_die("out of memory");
    sys = json_object_get(body, "systemInstruction");
    add_text(v->system,
             sys ? sys : json_object_get(body, "system_instruction"));
    add_text(v->system, json_object_get(body, "instructions"));
    if (json_is_string(json_object_get(body, "system")) ||
        json_is_array(json_object_get(body, "system")))
        add_text(v->system, json_object_get(body, "system"));
    view_tools(v, json_object_get(body, "tools"));
    arr = json_object_get(body, "input");
    if (json_is_string(arr))
        view_add(v, "user", arr);
    if (!json_is_array(arr))
        arr = json_object_get(body, "contents");
    if (!json_is_array(arr))
        arr = json_object_get(body, "messages");
    json_array_foreach(arr, i, m)
    {
        const char *role = json_string_value(json_object_get(m, "role"));
        const char *type = json_string_value(json_object_get(m, "type"));

        if (type && !strcmp(type, "function_call_output"))
            view_add(v, "tool", json_object_get(m, "output"));
        else if (json_object_get(m, "parts"))
            view_add(v, role ? role : "user", json_object_get(m, "parts"));
        else if (role)
            view_add(v, role, json_object_get(m, "content"));
    }
}

static void view_free(req_view *v)
{
    json_decref(v->system);
    json_decref(v->msgs);
    json_decref(v->tools);
}

static bool has(const char *text, const char *sub)
{
    return strstr(text ? text : "", sub) != NULL;
}

static bool has_tool(json_t *tools, const char *name)
{
    json_t *t;
    size_t i;

    json_array_foreach(tools, i, t)
    {
        if (!strcmp(json_string_value(t), name))
            return true;
    }
    return false;
}

/* Every name of want is in tools. */
static bool tools_cover(json_t *tools, json_t *want)
{
    json_t *t;
    size_t i;

    json_array_foreach(want, i, t)
    {
        if (!has_tool(tools, json_string_value(t)))
            return false;
    }
    return true;
}

static const char *msg_text(json_t *m)
{
    return json_string_value(json_object_get(m, "text"));
}

static bool view_matches(const req_view *v, const fake_match *m)
{
    json_t *e;
    size_t i;
    bool found;

    if (m->system) {
        json_t *sys = fake_join(v->system, NULL, 0);

        found = has(json_string_value(sys), m->system);
        json_decref(sys);
        if (!found)
            return false;
    }
    if (m->first_user) {
        found = false;
        json_array_foreach(v->msgs, i, e)
        {
            if (!strcmp(json_string_value(json_object_get(e, "role")),
                        "user")) {
                found = has(msg_text(e), m->first_user);
                break;
            }
        }
        if (!found)
            return false;
    }
    if (m->last_message &&
        (!json_array_size(v->msgs) ||
         !has(msg_text(json_array_get(v->msgs, json_array_size(v->msgs) - 1)),
              m->last_message)))
        return false;
    if (m->any_message) {
        found = false;
        json_array_foreach(v->msgs, i, e)
        {
            found = found || has(msg_text(e), m->any_message);
        }
        if (!found)
            return false;
    }
    if (m->tools_include && !tools_cover(v->tools, m->tools_include))
        return false;
    return !m->tools ||
           (tools_cover(v->tools, m->tools) && tools_cover(m->tools, v->tools));
}

bool fake_match_request(const fake_match *m, json_t *body)
{
    req_view v;
    bool ok;

    if (!json_is_object(body))
        return false;
    view_init(&v, body);
    ok = view_matches(&v, m);
    view_free(&v);
    return ok;
}

static const char *match_str(json_t *o, const char *key, size_t k)
{
    json_t *v = json_object_get(o, key);

    if (v && !json_is_string(v))
        fake_die("script: rules[%zu].match.%s must be a string", k, key);
    return json_string_value(v);
}

static json_t *match_names(json_t *o, const char *key, size_t k)
{
    json_t *v = json_object_get(o, key), *e;
    size_t i;

    if (!v)
        return NULL;
    if (!json_is_array(v))
        fake_die("script: rules[%zu].match.%s must be an array of strings", k,
                 key);
    json_array_foreach(v, i, e)
    {
        if (!json_is_string(e))
            fake_die("script: rules[%zu].match.%s[%zu] must be a string", k,
                     key, i);
    }
    return v;
}

void fake_match_load(fake_match *m, json_t *o, size_t k)
{
    const char *key;
    json_t *v;
    size_t i;

    if (!json_is_object(o) || !json_object_size(o))
        fake_die("script: rules[%zu].match must be a non-empty object", k);
    json_object_foreach(o, key, v)
    {
        bool known = key[0] == '_';

        for (i = 0; !known && i < sizeof(match_keys) / sizeof(*match_keys); i++)
            known = !strcmp(key, match_keys[i]);
        if (!known)
            fake_die("script: rules[%zu].match: unknown field \"%s\"", k, key);
    }
    m->first_user = match_str(o, "first_user", k);
    m->any_message = match_str(o, "any_message", k);
    m->last_message = match_str(o, "last_message", k);
    m->system = match_str(o, "system", k);
    m->tools = match_names(o, "tools", k);
    m->tools_include = match_names(o, "tools_include", k);
}

/*
 * Token counting per model: what a chat request costs in prompt tokens.
 *
 * OpenAI models are counted exactly with their encoding, plus the chat
 * format's overheads as the OpenAI cookbook accounts them (3 tokens per
 * message, its role and content, 1 more with a name, 3 to prime the
 * reply). Tool definitions are an approximation: OpenAI shows them to the
 * model as a TypeScript-like namespace, which loom renders and counts,
 * plus 9 tokens, minus 4 when the request also has a system message (the
 * accounting found by measuring the API; docs/tokenizer.md).
 *
 * Anthropic's and Gemini's tokenizers are not public: their counts are
 * o200k_base counts (or, without a vocabulary, a length estimate) scaled
 * by a correction factor per model id. The factor starts from a prior per
 * provider and moves towards reported / estimated each time the run loop
 * feeds back a provider's reported prompt tokens; counters of the same
 * model share it process-wide, behind a mutex.
 */
#include "core/tokenizer_internal.h"
#include "core/error.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define TOKENS_PER_MESSAGE 3
#define TOKENS_PER_NAME 1
#define TOKENS_PER_CALL 3    /* a tool call besides its name and args */
#define REPLY_PRIMING 3
#define TOOLS_OVERHEAD 9     /* once when tools are given */
#define TOOLS_SYSTEM_ADJUST 4 /* less when a system message is there too */
/* Anthropic's tool-use system prompt (its pricing docs; Claude 4). */
#define ANTHROPIC_TOOLS_PROMPT 346
#define OBSERVE_MIN 32       /* estimates below this are too noisy */
#define OBSERVE_WEIGHT 0.3   /* weight of a new ratio (log-space EMA) */
#define RATIO_MIN 0.25
#define RATIO_MAX 4.0
#define FACTOR_MIN 0.1
#define FACTOR_MAX 10.0
#define SCHEMA_DEPTH 16      /* deeper schemas render as "any" */
#define TOOLS_TEXT_MAX ((size_t)16 << 20)

typedef enum { FAM_OPENAI, FAM_ANTHROPIC, FAM_GEMINI, FAM_OTHER } family;

typedef struct model_state {
    struct model_state *next;
    double factor;
    char model[];
} model_state;

static pthread_mutex_t states_mu = PTHREAD_MUTEX_INITIALIZER;
static model_state *states;

struct loom_token_counter {
    const loom_tokenizer *tok; /* shared; NULL: length estimate */
    int exact;
    family fam;
    model_state *state;        /* NULL when exact */
    char method[48];
    size_t role_raw[4]; /* raw_str of each loom_role_name */
};

static void role_counts(loom_token_counter *c);
static size_t raw_text_memo(const loom_token_counter *c, const char *s,
                            size_t n);

size_t loom__token_estimate_length(const char *text, size_t len)
{
    const unsigned char *p = (const unsigned char *)text;
    size_t ascii = 0, other = 0, i;

    /* ~4 bytes per token for ASCII prose and code; about one token per
     * non-ASCII character (CJK ideographs, most other scripts) */
    for (i = 0; i < len; i++) {
        if (p[i] < 0x80)
            ascii++;
        else if ((p[i] & 0xc0) != 0x80)
            other++;
    }
    return (ascii + 3) / 4 + other;
}

static int has_prefix(const char *s, const char *prefix)
{
    return !strncmp(s, prefix, strlen(prefix));
}

/* s is the id or the id followed by "-..." */
static int is_family(const char *s, const char *id)
{
    size_t n = strlen(id);
    return !strncmp(s, id, n) && (s[n] == '\0' || s[n] == '-');
}

/* The exact encoding of an OpenAI model id, or NULL. */
static const char *openai_encoding(const char *id)
{
    static const char *const o200k[] = {"gpt-4o", "gpt-4.1", "gpt-4.5",
                                        "gpt-5", "chatgpt-4o"};
    size_t k;

    for (k = 0; k < sizeof(o200k) / sizeof(o200k[0]); k++)
        if (has_prefix(id, o200k[k]))
            return "o200k_base";
    if (is_family(id, "o1") || is_family(id, "o3") || is_family(id, "o4"))
        return "o200k_base";
    if (is_family(id, "gpt-4") || has_prefix(id, "gpt-3.5") ||
        has_prefix(id, "gpt-35") || has_prefix(id, "text-embedding-3-") ||
        !strcmp(id, "text-embedding-ada-002"))
        return "cl100k_base";
    return NULL;
}

static model_state *state_for(const char *id, double prior)
{
    model_state *s;
    size_t n = strlen(id);

    pthread_mutex_lock(&states_mu);
    for (s = states; s; s = s->next)
        if (!strcmp(s->model, id))
            goto done;
    s = malloc(sizeof(*s) + n + 1);
    if (s) {
        memcpy(s->model, id, n + 1);
        s->factor = prior;
        s->next = states;
        states = s;
    }
done:
    pthread_mutex_unlock(&states_mu);
    return s;
}

void loom__token_counter_reset(void)
{
    pthread_mutex_lock(&states_mu);
    while (states) {
        model_state *s = states;
        states = s->next;
        free(s);
    }
    pthread_mutex_unlock(&states_mu);
}

int loom_token_counter_for_model(loom_token_counter **out, const char *model)
{
    loom_token_counter *c;
    const char *slash, *enc;
    char id[128];
    double prior = 1.1;
    size_t i;

    if (!out || !model || !*model)
        return loom__error_set(LOOM_EINVALID, "token counter: no model");
    *out = NULL;
    slash = strrchr(model, '/');
    snprintf(id, sizeof(id), "%s", slash ? slash + 1 : model);
    if (!id[0])
        return loom__error_set(LOOM_EINVALID, "token counter: bad model "
                               "\"%s\"", model);
    for (i = 0; id[i]; i++)
        id[i] = (char)tolower((unsigned char)id[i]);
    c = calloc(1, sizeof(*c));
    if (!c)
        return loom__error_oom();
    enc = openai_encoding(id);
    c->fam = enc ? FAM_OPENAI : has_prefix(id, "claude") ? FAM_ANTHROPIC :
             has_prefix(id, "gemini") || has_prefix(id, "gemma") ?
             FAM_GEMINI : FAM_OTHER;
    c->tok = loom_tokenizer_shared(enc ? enc : "o200k_base");
    c->exact = enc && c->tok;
    role_counts(c);
    if (c->exact) {
        snprintf(c->method, sizeof(c->method), "%s", enc);
    } else {
        /* priors: Claude's tokenizer yields ~20% more tokens than
         * o200k_base on English; Gemini's about as many */
        if (c->fam == FAM_ANTHROPIC)
            prior = 1.2;
        else if (c->fam == FAM_GEMINI || c->fam == FAM_OPENAI)
            prior = 1.0;
        snprintf(c->method, sizeof(c->method), "estimate:%s",
                 c->tok ? loom_tokenizer_name(c->tok) : "length");
        c->state = state_for(id, prior);
        if (!c->state) {
            free(c);
            return loom__error_oom();
        }
    }
    *out = c;
    return 0;
}

void loom_token_counter_free(loom_token_counter *c)
{
    free(c);
}

int loom_token_counter_is_exact(const loom_token_counter *c)
{
    return c && c->exact;
}

const char *loom_token_counter_method(const loom_token_counter *c)
{
    return c ? c->method : "";
}

double loom_token_counter_factor(const loom_token_counter *c)
{
    double f;

    if (!c || c->exact)
        return 1.0;
    pthread_mutex_lock(&states_mu);
    f = c->state->factor;
    pthread_mutex_unlock(&states_mu);
    return f;
}

void loom_token_counter_observe(loom_token_counter *c, size_t estimated,
                                size_t reported)
{
    double r, f;

    if (!c || c->exact || estimated < OBSERVE_MIN || !reported)
        return;
    r = (double)reported / (double)estimated;
    r = r < RATIO_MIN ? RATIO_MIN : r > RATIO_MAX ? RATIO_MAX : r;
    pthread_mutex_lock(&states_mu);
    /* `estimated` was made with (about) the current factor, so the factor
     * that would have been right is factor * r: step towards it */
    f = c->state->factor * exp(OBSERVE_WEIGHT * log(r));
    c->state->factor = f < FACTOR_MIN ? FACTOR_MIN :
                       f > FACTOR_MAX ? FACTOR_MAX : f;
    pthread_mutex_unlock(&states_mu);
}

/* Unscaled tokens of text. */
static size_t raw_text(const loom_token_counter *c, const char *s, size_t n)
{
    size_t k;

    if (!s || !n)
        return 0;
    if (c->tok) {
        k = loom_tokenizer_count(c->tok, s, n);
        if (k != (size_t)-1)
            return k;
    }
    return loom__token_estimate_length(s, n);
}

static size_t raw_str(const loom_token_counter *c, const char *s)
{
    return s ? raw_text(c, s, strlen(s)) : 0;
}

/*
 * The role names' counts, process-wide per tokenizer: every message
 * counts its role's name, the same few words each time, and a count
 * through the vocabulary costs far more than the lookup. Keyed by the
 * tokenizer like the text memo below (loom__token_counter_tools_memo_reset
 * forgets both); ROLES_MEMO_N tokenizers, the oldest replaced.
 */
#define ROLES_MEMO_N 8

static pthread_mutex_t roles_memo_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    const loom_tokenizer *tok;
    size_t raw[4];
} roles_memo[ROLES_MEMO_N];
static size_t roles_memo_next;

/* Fills c->role_raw with raw_str of each role's name. */
static void role_counts(loom_token_counter *c)
{
    size_t i, r;

    if (c->tok) {
        pthread_mutex_lock(&roles_memo_mu);
        for (i = 0; i < ROLES_MEMO_N; i++)
            if (roles_memo[i].tok == c->tok)
                break;
        if (i < ROLES_MEMO_N)
            memcpy(c->role_raw, roles_memo[i].raw, sizeof(c->role_raw));
        pthread_mutex_unlock(&roles_memo_mu);
        if (i < ROLES_MEMO_N)
            return;
    }
    for (r = 0; r < 4; r++)
        c->role_raw[r] = raw_str(c, loom_role_name((loom_role)r));
    if (!c->tok)
        return;
    pthread_mutex_lock(&roles_memo_mu);
    roles_memo[roles_memo_next].tok = c->tok;
    memcpy(roles_memo[roles_memo_next].raw, c->role_raw, sizeof(c->role_raw));
    roles_memo_next = (roles_memo_next + 1) % ROLES_MEMO_N;
    pthread_mutex_unlock(&roles_memo_mu);
}

static size_t scale(const loom_token_counter *c, size_t raw)
{
    double f;

    if (c->exact || !raw)
        return raw;
    f = loom_token_counter_factor(c) * (double)raw;
    return f < 1.0 ? 1 : (size_t)llround(f);
}

static size_t raw_message(const loom_token_counter *c, const loom_message *m)
{
    size_t n = TOKENS_PER_MESSAGE, i;

    /* loom_role_name gives "user" for a role out of range */
    n += c->role_raw[(unsigned)m->role < 4 ? m->role : LOOM_ROLE_USER];
    /* a system message is most often an agent's prompt, the same in
     * each of its runs */
    n += m->role == LOOM_ROLE_SYSTEM && m->content
             ? raw_text_memo(c, m->content, strlen(m->content))
             : raw_str(c, m->content);
    if (m->name)
        n += raw_str(c, m->name) + TOKENS_PER_NAME;
    for (i = 0; i < m->tool_calls_len; i++)
        n += TOKENS_PER_CALL + raw_str(c, m->tool_calls[i].name) +
             raw_str(c, m->tool_calls[i].arguments);
    /* OpenAI's chat API takes no reasoning back; others are sent it */
    if (c->fam != FAM_OPENAI)
        n += raw_str(c, m->reasoning);
    return n;
}

/*
 * The tokens of m's images and files, which no text count sees: a fixed
 * estimate per image as each provider bills a typical picture (OpenAI:
 * 85 at detail "low", else 765, a 1024x1024 image in 512-pixel tiles;
 * Anthropic about width*height/750, 1,600 for the 1.15 megapixels it
 * scales images down to; Gemini 258 per 768-pixel tile, 1,032 for four),
 * and for a document one token per 16 bytes of its data, at least 1,500
 * (a page as text plus an image of it). Counted apart from the factor,
 * which corrects text counts only.
 */
static size_t media_tokens(const loom_token_counter *c, const loom_message *m)
{
    size_t n = 0, per_image;

    per_image = c->fam == FAM_ANTHROPIC ? 1600
                : c->fam == FAM_GEMINI  ? 1032
                                        : 765;
    for (size_t i = 0; i < m->parts_len; i++) {
        const loom_part *p = &m->parts[i];
        size_t bytes;
        if (p->kind == LOOM_PART_IMAGE) {
            n += p->detail && strcmp(p->detail, "low") == 0 &&
                         c->fam != FAM_ANTHROPIC && c->fam != FAM_GEMINI
                     ? 85
                     : per_image;
        } else if (p->kind == LOOM_PART_FILE) {
            bytes = loom_part_data_size(p) / 16;
            n += bytes > 1500 ? bytes : 1500;
        }
    }
    return n;
}

size_t loom_token_counter_text(const loom_token_counter *c, const char *text,
                               size_t len)
{
    return c ? scale(c, raw_text(c, text, len)) : 0;
}

size_t loom_token_counter_message(const loom_token_counter *c,
                                  const loom_message *m)
{
    return c && m ? scale(c, raw_message(c, m)) + media_tokens(c, m) : 0;
}

/* ---------------------------------------------------------------------
 * Tool definitions as OpenAI renders them:
 *
 *   namespace functions {
 *
 *   // description
 *   type name = (_: {
 *   // property description
 *   prop: string,
 *   opt?: "a" | "b",
 *   }) => any;
 *
 *   } // namespace functions
 */

static int render_type(loom_buf *b, const json_t *schema, int indent,
                       int depth);

static int render_enum(loom_buf *b, const json_t *values, int quote)
{
    size_t i;
    json_t *v;
    int err = 0;

    json_array_foreach(values, i, v) {
        if (i)
            err = loom_buf_puts(b, " | ");
        if (!err && json_is_string(v))
            err = loom_buf_printf(b, quote ? "\"%s\"" : "%s",
                                  json_string_value(v));
        else if (!err && json_is_number(v))
            err = loom_buf_printf(b, "%g", json_number_value(v));
        if (err < 0)
            return err;
    }
    return 0;
}

static int is_required(const json_t *schema, const char *name)
{
    const json_t *req = json_object_get(schema, "required");
    size_t i;
    json_t *v;

    json_array_foreach(req, i, v)
        if (json_is_string(v) && !strcmp(json_string_value(v), name))
            return 1;
    return 0;
}

static int render_props(loom_buf *b, const json_t *schema, int indent,
                        int depth)
{
    const json_t *props = json_object_get(schema, "properties");
    const char *name, *desc;
    json_t *p;
    int err = 0, first = 1;

    json_object_foreach((json_t *)props, name, p) {
        desc = json_string_value(json_object_get(p, "description"));
        if (!first)
            err = loom_buf_putc(b, '\n');
        first = 0;
        if (!err && desc && indent < 2)
            err = loom_buf_printf(b, "%*s// %s\n", indent, "", desc);
        if (!err)
            err = loom_buf_printf(b, "%*s%s%s: ", indent, "", name,
                                  is_required(schema, name) ? "" : "?");
        if (!err)
            err = render_type(b, p, indent, depth + 1);
        if (!err)
            err = loom_buf_putc(b, ',');
        if (err < 0)
            return err;
    }
    return 0;
}

static int render_type(loom_buf *b, const json_t *schema, int indent,
                       int depth)
{
    const char *type = json_string_value(json_object_get(schema, "type"));
    const json_t *en = json_object_get(schema, "enum");
    int err;

    if (!type || depth > SCHEMA_DEPTH)
        return loom_buf_puts(b, "any");
    if (!strcmp(type, "string") || !strcmp(type, "number") ||
        !strcmp(type, "integer")) {
        if (json_array_size(en))
            return render_enum(b, en, !strcmp(type, "string"));
        return loom_buf_puts(b, strcmp(type, "string") ? "number" : "string");
    }
    if (!strcmp(type, "boolean") || !strcmp(type, "null"))
        return loom_buf_puts(b, type);
    if (!strcmp(type, "array")) {
        const json_t *items = json_object_get(schema, "items");
        err = items ? render_type(b, items, indent, depth + 1) :
                      loom_buf_puts(b, "any");
        return err < 0 ? err : loom_buf_puts(b, "[]");
    }
    if (!strcmp(type, "object")) {
        if (!json_object_size(json_object_get(schema, "properties")))
            return loom_buf_puts(b, "object");
        err = loom_buf_puts(b, "{\n");
        if (!err)
            err = render_props(b, schema, indent + 2, depth);
        if (!err)
            err = loom_buf_printf(b, "\n%*s}", indent, "");
        return err;
    }
    return loom_buf_puts(b, "any");
}

static int render_tools(loom_buf *b, const loom_tool_def *tools, size_t n)
{
    size_t i;
    int err = loom_buf_puts(b, "namespace functions {\n\n");

    for (i = 0; !err && i < n; i++) {
        const loom_tool_def *t = &tools[i];
        const char *name = t->name ? t->name : "";
        if (t->description && *t->description)
            err = loom_buf_printf(b, "// %s\n", t->description);
        if (!err && json_object_size(json_object_get(t->parameters,
                                                     "properties"))) {
            err = loom_buf_printf(b, "type %s = (_: {\n", name);
            if (!err)
                err = render_props(b, t->parameters, 0, 0);
            if (!err)
                err = loom_buf_puts(b, "\n}) => any;\n\n");
        } else if (!err) {
            err = loom_buf_printf(b, "type %s = () => any;\n\n", name);
        }
    }
    return err ? err : loom_buf_puts(b, "} // namespace functions");
}

/*
 * Counts of texts every run of an agent sends again, process-wide: its
 * rendered tools and its system prompt; counting them costs far more
 * than the lookup. Keyed by the tokenizer and the whole text (compared
 * byte for byte), so a hit is the count raw_text would give; TEXT_MEMO_N
 * entries, the oldest replaced, texts up to TEXT_MEMO_MAX bytes.
 */
#define TEXT_MEMO_N 16
#define TEXT_MEMO_MAX ((size_t)64 << 10)

typedef struct {
    const loom_tokenizer *tok;
    char *text;
    size_t len;
    size_t raw;
} text_memo_item;

static pthread_mutex_t text_memo_mu = PTHREAD_MUTEX_INITIALIZER;
static text_memo_item text_memo[TEXT_MEMO_N];
static size_t text_memo_next;

/* The memo's count of text by tok, or (size_t)-1. */
static size_t text_memo_get(const loom_tokenizer *tok, const char *text,
                            size_t len)
{
    size_t k = (size_t)-1;

    pthread_mutex_lock(&text_memo_mu);
    for (size_t i = 0; i < TEXT_MEMO_N; i++) {
        const text_memo_item *it = &text_memo[i];
        if (it->text && it->tok == tok && it->len == len &&
            memcmp(it->text, text, len) == 0) {
            k = it->raw;
            break;
        }
    }
    pthread_mutex_unlock(&text_memo_mu);
    return k;
}

static void text_memo_put(const loom_tokenizer *tok, const char *text,
                          size_t len, size_t raw)
{
    char *copy;
    text_memo_item *it;

    if (len > TEXT_MEMO_MAX || !(copy = malloc(len ? len : 1)))
        return;
    memcpy(copy, text, len);
    pthread_mutex_lock(&text_memo_mu);
    it = &text_memo[text_memo_next];
    text_memo_next = (text_memo_next + 1) % TEXT_MEMO_N;
    free(it->text);
    it->tok = tok;
    it->text = copy;
    it->len = len;
    it->raw = raw;
    pthread_mutex_unlock(&text_memo_mu);
}

void loom__token_counter_tools_memo_reset(void)
{
    pthread_mutex_lock(&text_memo_mu);
    for (size_t i = 0; i < TEXT_MEMO_N; i++) {
        free(text_memo[i].text);
        memset(&text_memo[i], 0, sizeof(text_memo[i]));
    }
    text_memo_next = 0;
    pthread_mutex_unlock(&text_memo_mu);
    pthread_mutex_lock(&roles_memo_mu);
    memset(roles_memo, 0, sizeof(roles_memo));
    roles_memo_next = 0;
    pthread_mutex_unlock(&roles_memo_mu);
}

/* raw_text of s, through the memo when there is a vocabulary. */
static size_t raw_text_memo(const loom_token_counter *c, const char *s,
                            size_t n)
{
    size_t k;

    if (!c->tok || (k = text_memo_get(c->tok, s ? s : "", n)) == (size_t)-1) {
        k = raw_text(c, s, n);
        if (c->tok)
            text_memo_put(c->tok, s ? s : "", n, k);
    }
    return k;
}

static size_t raw_tools(const loom_token_counter *c,
                        const loom_tool_def *tools, size_t n)
{
    loom_buf b = LOOM_BUF_INIT(TOOLS_TEXT_MAX);
    size_t k;

    if (!n)
        return 0;
    if (render_tools(&b, tools, n) < 0) {
        /* past the limit: estimate from the length rendered so far */
        k = TOOLS_TEXT_MAX / 4;
        loom_error_clear();
    } else {
        k = raw_text_memo(c, b.ptr, b.len);
    }
    loom_buf_free(&b);
    return k + TOOLS_OVERHEAD;
}

size_t loom_token_counter_tools(const loom_token_counter *c,
                                const loom_tool_def *tools, size_t n)
{
    size_t k;

    if (!c || !tools || !n)
        return 0;
    k = scale(c, raw_tools(c, tools, n));
    return c->fam == FAM_ANTHROPIC ? k + ANTHROPIC_TOOLS_PROMPT : k;
}

size_t loom__token_counter_tools_raw(const loom_token_counter *c,
                                     const loom_tool_def *tools, size_t n)
{
    return c && tools ? raw_tools(c, tools, n) : 0;
}

/* The tokens of a request of that many unscaled and media tokens. */
static size_t request_total(const loom_token_counter *c, size_t raw,
                            size_t media, int system, size_t tools_raw,
                            size_t ntools)
{
    size_t k;

    raw += tools_raw;
    if (ntools && system)
        raw -= TOOLS_SYSTEM_ADJUST;
    k = scale(c, raw) + media;
    return c->fam == FAM_ANTHROPIC && ntools ? k + ANTHROPIC_TOOLS_PROMPT : k;
}

/* FNV-1a over s (NULL and "" differ), with its length. */
static uint64_t hash_str(uint64_t h, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;

    if (!s)
        return (h ^ 0xffu) * 0x100000001b3ULL;
    for (; *p; p++)
        h = (h ^ *p) * 0x100000001b3ULL;
    return (h ^ 0xfeu) * 0x100000001b3ULL;
}

static uint64_t hash_num(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++, v >>= 8)
        h = (h ^ (v & 0xffu)) * 0x100000001b3ULL;
    return h;
}

/* A hash of all raw_message and media_tokens read of m. */
static uint64_t message_hash(const loom_message *m)
{
    uint64_t h = hash_num(0xcbf29ce484222325ULL, (uint64_t)m->role);

    h = hash_str(h, m->content);
    h = hash_str(h, m->name);
    h = hash_str(h, m->reasoning);
    h = hash_num(h, m->tool_calls_len);
    for (size_t i = 0; i < m->tool_calls_len; i++) {
        h = hash_str(h, m->tool_calls[i].name);
        h = hash_str(h, m->tool_calls[i].arguments);
    }
    h = hash_num(h, m->parts_len);
    for (size_t i = 0; i < m->parts_len; i++) {
        const loom_part *p = &m->parts[i];
        h = hash_num(h, (uint64_t)p->kind);
        h = hash_str(h, p->detail);
        if (p->kind == LOOM_PART_FILE)
            h = hash_num(h, loom_part_data_size(p));
    }
    return h;
}

size_t loom__token_counter_request_memo(const loom_token_counter *c,
                                        loom__token_memo *memo,
                                        const loom_message *messages,
                                        size_t nmessages, size_t tools_raw,
                                        size_t ntools)
{
    size_t raw = REPLY_PRIMING, media = 0, i;
    int system = 0;

    if (!c)
        return 0;
    if (memo && memo->counter != c) {
        memo->counter = c;
        memo->len = 0;
    }
    if (memo && nmessages > memo->cap) {
        loom__token_memo_item *p = realloc(memo->items, nmessages * sizeof(*p));
        if (p) {
            memo->items = p;
            memo->cap = nmessages;
        }
    }
    for (i = 0; messages && i < nmessages; i++) {
        const loom_message *m = &messages[i];
        loom__token_memo_item fresh,
            *it = memo && i < memo->cap ? &memo->items[i] : NULL;
        uint64_t h = it ? message_hash(m) : 0;
        if (!it || i >= memo->len || it->hash != h ||
            it->content != m->content) {
            fresh.hash = h;
            fresh.content = m->content;
            fresh.raw = raw_message(c, m);
            fresh.media = media_tokens(c, m);
            fresh.system = m->role == LOOM_ROLE_SYSTEM;
            if (it)
                *it = fresh;
            else
                it = &fresh;
        }
        raw += it->raw;
        media += it->media;
        system |= it->system;
    }
    /* Kept: the items of this request's messages (at most cap). */
    if (memo)
        memo->len = nmessages < memo->cap ? nmessages : memo->cap;
    return request_total(c, raw, media, system, tools_raw, ntools);
}

size_t loom__token_counter_request_raw(const loom_token_counter *c,
                                       const loom_message *messages,
                                       size_t nmessages, size_t tools_raw,
                                       size_t ntools)
{
    return loom__token_counter_request_memo(c, NULL, messages, nmessages,
                                            tools_raw, ntools);
}

void loom__token_memo_free(loom__token_memo *memo)
{
    free(memo->items);
    memset(memo, 0, sizeof(*memo));
}

size_t loom_token_counter_request(const loom_token_counter *c,
                                  const loom_message *messages,
                                  size_t nmessages, const loom_tool_def *tools,
                                  size_t ntools)
{
    if (!tools)
        ntools = 0;
    return loom__token_counter_request_raw(
        c, messages, nmessages, loom__token_counter_tools_raw(c, tools, ntools),
        ntools);
}

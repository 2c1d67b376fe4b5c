/*
 * Internal: what config.c and config_yaml.c share. config.c owns building,
 * freeing and the environment; config_yaml.c reads YAML into a config
 * with these helpers. The error list (config_errors.c) also serves the
 * checks made over a loaded config (the session's tool names).
 */
#ifndef LOOM_CORE_CONFIG_INTERNAL_H
#define LOOM_CORE_CONFIG_INTERNAL_H

#include "core/text.h"
#include "loom/buf.h"
#include "loom/config.h"

#define LOOM__CONFIG_MAX_BYTES ((size_t)4 << 20)
#define LOOM__CONFIG_NAME_MAX LOOM__NAME_MAX /* tool, provider, agent names */

/*
 * The errors of a load or check (config_errors.c): the first
 * LOOM_CONFIG_MAX_ERRORS kept one per line, the others counted. code is
 * the first one's.
 */
typedef struct {
    loom_buf kept;
    size_t count;
    int code;
    int oom; /* a line could not be kept: raising gives LOOM_ENOMEM */
} loom__config_errors;

void loom__config_errors_init(loom__config_errors *e);
/* Adds one error (a line break in it becomes a space). Returns code. */
int loom__config_errors_add(loom__config_errors *e, int code, const char *fmt,
                            ...) __attribute__((format(printf, 3, 4)));
/*
 * With no error, 0. Else raises the first error's code with a message
 * that is the first error, then the next ones as far as whole lines fit
 * loom_error_last(), then "... and N more errors"; *all (when not NULL;
 * caller frees) gets every kept line and that count. Frees e's contents
 * either way. Returns the code, or LOOM_ENOMEM (*all NULL).
 */
int loom__config_errors_raise(loom__config_errors *e, char **all);
void loom__config_errors_free(loom__config_errors *e);

/*
 * Reads the YAML text into cfg over what it holds (config_yaml.c). Each
 * error found is added to errs, and reading goes on past those it can
 * skip (a bad value, an unknown key); an error past a limit, of the YAML
 * syntax or of memory stops it. Returns 0, or the code of the error that
 * stopped it (LOOM_EINVALID when it only skipped). On error cfg may be
 * half filled; the caller frees it.
 */
int loom__config_parse_yaml(loom_config *cfg, const char *data, size_t len,
                            const char *name, loom__config_errors *errs);

/*
 * Appends the file at path to b (at most max bytes; what it is, for the
 * message: "a config file"). LOOM_ENOTFOUND when it does not exist,
 * LOOM_EINVALID for a directory, LOOM_ETOOLARGE past max, LOOM_EIO when
 * it cannot be read, each with a message that starts with path.
 */
int loom__config_read_file(loom_buf *b, const char *path, size_t max,
                           const char *what);

/* Copies s for an error message into dst (cap >= 8): at most 48 bytes,
 * control characters as '?', "..." when cut. Returns dst. */
static inline const char *loom__config_shown(char *dst, size_t cap,
                                             const char *s)
{
    return loom__text_shown(dst, cap, s, 48);
}
/* [A-Za-z0-9_-]{1,64}, plus '.' when dots is set. */
static inline int loom__config_valid_name(const char *s, int dots)
{
    return loom__text_is_name(s, dots);
}
/* An http:// or https:// URL that libcurl parses, with "//" and a host. */
int loom__config_valid_url(const char *s);
/* Frees what an MCP server's config holds (the MCP client keeps copies)
 * and zeroes it. */
void loom__config_mcp_server_clear(loom_mcp_server_config *m);
void loom__config_strip_slashes(char *s);
/* Appends name to the ", "-separated list in dst, "..." once full. */
void loom__config_names_add(char *dst, size_t cap, const char *name);
/* The providers' names for messages ("none" when there are none). */
const char *loom__config_provider_names(char *dst, size_t cap,
                                        const loom_config *cfg);

/* Length of the provider part of "provider/model"; 0 when name does not
 * have that form. */
size_t loom__config_provider_part(const char *name);
const loom_provider_config *loom__config_find_provider_n(const loom_config *cfg,
                                                         const char *name,
                                                         size_t len);
/* 0 when name resolves (listed, or provider/model with a known provider);
 * else 1 with the reason in why. */
int loom__config_model_unresolved(const loom_config *cfg, const char *name,
                                  char *why, size_t cap);

/* Whether kind is a known wire format; *default_url (when given) gets its
 * default base URL, NULL when a file must give one. */
int loom__config_kind_known(const char *kind, const char **default_url);
/* "openai, openai-responses, ...", for messages. */
const char *loom__config_kind_names(void);

/* A model entry's defaults (capabilities, no prices, cfg's routing). */
void loom__config_model_defaults(loom_model_config *m,
                                 const loom_config *cfg);

/* A provider with its defaults, kind "openai" and empty headers. */
int loom__config_provider_init(loom_provider_config *p, const char *name);
void loom__config_provider_clear(loom_provider_config *p);
/* Moves p into cfg, replacing a provider of the same name. */
int loom__config_provider_install(loom_config *cfg, loom_provider_config *p);

#endif

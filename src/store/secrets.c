/*
 * Secrets at rest (loom/store.h): the store's key and the sealing of
 * what it keeps for loom's clients. The key is derived (core/seal.h)
 * from a secret: the one the embedder set, else $LOOM_SECRET_KEY, else
 * the text of a key file beside the database. The key file is made on
 * first need, race-free between processes: written whole to a private
 * temporary file (mode 0600), then linked to its name, so a reader sees
 * either no file or a complete one and a second writer loses to the
 * first. Secrets are never logged. Each use (MCP credentials, users'
 * settings) seals with a key of its own, derived for its purpose.
 */
#include "core/clock.h"
#include "core/error.h"
#include "core/seal.h"
#include "loom/log.h"
#include "store/store_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

/* The purpose the MCP credentials' key is derived for. */
#define MCP_PURPOSE "loom mcp credentials v1"
/* The purpose the users' settings' key is derived for. */
#define SETTINGS_PURPOSE "loom user settings v1"
/* Characters of a key file's text: at least, and read at most. */
#define KEY_TEXT_MIN 32
#define KEY_TEXT_MAX 512

int loom__store_secrets_init(loom_store *st, const char *path)
{
    size_t n = strlen(path);

    if (!(st->key_file = malloc(n + 5)))
        return loom__error_oom();
    memcpy(st->key_file, path, n);
    memcpy(st->key_file + n, ".key", 5);
    return 0;
}

int loom_store_set_secret(loom_store *st, const char *secret)
{
    char *s = NULL;

    if (!st)
        return loom__error_set(LOOM_EINVALID, "store: NULL store");
    if (secret && *secret && !(s = strdup(secret)))
        return loom__error_oom();
    free(st->secret);
    st->secret = s;
    return 0;
}

/* Reads the key file's text into out: 0, LOOM_ENOTFOUND when absent. */
static int key_file_read(const loom_store *st, char out[KEY_TEXT_MAX + 1])
{
    struct stat sb;
    ssize_t n;
    int fd = open(st->key_file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

    if (fd < 0)
        return errno == ENOENT
                   ? LOOM_ENOTFOUND
                   : loom__error_set(LOOM_EIO, "store: key file %s: %s",
                                     st->key_file, strerror(errno));
    if (fstat(fd, &sb) == 0 && (sb.st_mode & 077))
        loom_warn("store: key file %s can be read by others than its owner "
                  "(chmod 600 it)",
                  st->key_file);
    n = read(fd, out, KEY_TEXT_MAX);
    close(fd);
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\r'))
        n--;
    if (n < KEY_TEXT_MIN)
        return loom__error_set(LOOM_EPROTO,
                               "store: key file %s is not a key (fewer than "
                               "%d characters)",
                               st->key_file, KEY_TEXT_MIN);
    out[n] = '\0';
    return 0;
}

/* Makes the key file (someone else may win the race: then theirs is
 * used). */
static int key_file_make(const loom_store *st)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char r[32];
    char text[2 * sizeof(r) + 1], *tmp;
    size_t n = strlen(st->key_file);
    int fd, ok, rc = 0;

    if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r))
        return loom__error_set(LOOM_ERROR, "store: no random bytes for a key");
    for (size_t i = 0; i < sizeof(r); i++) {
        text[2 * i] = hex[r[i] >> 4];
        text[2 * i + 1] = hex[r[i] & 15];
    }
    text[2 * sizeof(r)] = '\n';
    if (!(tmp = malloc(n + 8)))
        return loom__error_oom();
    memcpy(tmp, st->key_file, n);
    memcpy(tmp + n, ".XXXXXX", 8);
    /* mkstemp makes the file with mode 0600. */
    if ((fd = mkstemp(tmp)) < 0) {
        rc = loom__error_set(LOOM_EIO, "store: making key file %s: %s",
                             st->key_file, strerror(errno));
        free(tmp);
        return rc;
    }
    ok = write(fd, text, sizeof(text)) == (ssize_t)sizeof(text) &&
         fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    if (!ok || (link(tmp, st->key_file) != 0 && errno != EEXIST))
        rc = loom__error_set(LOOM_EIO, "store: making key file %s: %s",
                             st->key_file, strerror(errno));
    else
        loom_info("store: made key file %s (keep it: what the store seals "
                  "opens only with it)",
                  st->key_file);
    unlink(tmp);
    free(tmp);
    return rc;
}

/* The key for purpose. */
static int store_key(const loom_store *st, const char *purpose,
                     unsigned char key[LOOM_SEAL_KEY_SIZE])
{
    const char *env = getenv(LOOM_STORE_SECRET_ENV);
    char text[KEY_TEXT_MAX + 1];
    int rc;

    if (st->secret)
        return loom__seal_key(key, purpose, st->secret);
    if (env && *env)
        return loom__seal_key(key, purpose, env);
    if (!st->key_file)
        return loom__error_set(
            LOOM_EINVALID,
            "store: no secret key (set " LOOM_STORE_SECRET_ENV ")");
    if ((rc = key_file_read(st, text)) == LOOM_ENOTFOUND &&
        (rc = key_file_make(st)) == 0)
        rc = key_file_read(st, text);
    if (rc == LOOM_ENOTFOUND)
        rc = loom__error_set(LOOM_EIO, "store: key file %s vanished",
                             st->key_file);
    if (rc == 0)
        rc = loom__seal_key(key, purpose, text);
    explicit_bzero(text, sizeof(text));
    return rc;
}

static int check_server(loom_store *st, const char *server)
{
    if (!st || !server || !*server)
        return loom__error_set(LOOM_EINVALID,
                               "store: NULL store or empty server name");
    return 0;
}

/* Opens sealed (n bytes) with the key for purpose into *plain; what
 * names it when it does not open. */
static int open_sealed(loom_store *st, const char *purpose,
                       const unsigned char *sealed, size_t n, char **plain,
                       const char *what)
{
    unsigned char key[LOOM_SEAL_KEY_SIZE];
    int rc;

    if ((rc = store_key(st, purpose, key)) == 0 &&
        (rc = loom__unseal(key, sealed, n, plain)) != 0)
        rc = loom__error_set(rc,
                             "store: %s do not open with this store's key "
                             "(another key, or damaged)",
                             what);
    explicit_bzero(key, sizeof(key));
    return rc;
}

/* Seals plain with the key for purpose into *sealed (caller frees). */
static int make_sealed(loom_store *st, const char *purpose, const char *plain,
                       unsigned char **sealed, size_t *n)
{
    unsigned char key[LOOM_SEAL_KEY_SIZE];
    int rc;

    if ((rc = store_key(st, purpose, key)) == 0)
        rc = loom__seal(key, plain, sealed, n);
    explicit_bzero(key, sizeof(key));
    return rc;
}

int loom_store_mcp_credentials_load(loom_store *st, const char *server,
                                    const char *user_id, char **json)
{
    unsigned char *sealed = NULL;
    char what[160];
    size_t n = 0;
    int rc;

    if (json)
        *json = NULL;
    if (!json)
        return loom__error_set(LOOM_EINVALID, "store: no out pointer");
    if ((rc = check_server(st, server)) != 0 ||
        (rc = st->vt->mcp_credentials_get(st, server, user_id ? user_id : "",
                                          &sealed, &n)) != 0)
        return rc;
    snprintf(what, sizeof(what), "the credentials of MCP server '%.80s'",
             server);
    rc = open_sealed(st, MCP_PURPOSE, sealed, n, json, what);
    free(sealed);
    return rc;
}

int loom_store_mcp_credentials_save(loom_store *st, const char *server,
                                    const char *user_id, const char *json)
{
    unsigned char *sealed = NULL;
    size_t n = 0;
    int rc;

    if ((rc = check_server(st, server)) != 0)
        return rc;
    if (!json)
        return loom__error_set(LOOM_EINVALID, "store: NULL credentials");
    if ((rc = make_sealed(st, MCP_PURPOSE, json, &sealed, &n)) == 0)
        rc = st->vt->mcp_credentials_put(st, server, user_id ? user_id : "",
                                         sealed, n, loom__unix_ms());
    free(sealed);
    return rc;
}

int loom_store_mcp_credentials_delete(loom_store *st, const char *server,
                                      const char *user_id)
{
    int rc;

    if ((rc = check_server(st, server)) != 0)
        return rc;
    return st->vt->mcp_credentials_delete(st, server, user_id ? user_id : "");
}

int loom_store_user_settings_load(loom_store *st, const char *user_id,
                                  char **json)
{
    unsigned char *sealed = NULL;
    size_t n = 0;
    int rc;

    if (json)
        *json = NULL;
    if (!st || !json)
        return loom__error_set(LOOM_EINVALID, "store: NULL argument");
    if ((rc = st->vt->user_settings_get(st, user_id ? user_id : "", &sealed,
                                        &n)) != 0)
        return rc;
    rc = open_sealed(st, SETTINGS_PURPOSE, sealed, n, json,
                     "the user's settings");
    free(sealed);
    return rc;
}

int loom_store_user_settings_save(loom_store *st, const char *user_id,
                                  const char *json)
{
    unsigned char *sealed = NULL;
    size_t n = 0;
    int rc;

    if (!st || !json)
        return loom__error_set(LOOM_EINVALID, "store: NULL argument");
    if ((rc = make_sealed(st, SETTINGS_PURPOSE, json, &sealed, &n)) == 0)
        rc = st->vt->user_settings_put(st, user_id ? user_id : "", sealed, n,
                                       loom__unix_ms());
    free(sealed);
    return rc;
}

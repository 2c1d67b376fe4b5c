/*
 * Research runs, the store's front (loom/store.h, docs/store.md
 * #research-runs): argument checks and the clock; the backend moves the
 * rows.
 */
#include "core/clock.h"
#include "core/error.h"
#include "store/store_internal.h"

#include <string.h>

static int check_run_id(const char *id)
{
    if (!id || !*id || strlen(id) > LOOM_ID_MAX)
        return loom__error_set(LOOM_EINVALID,
                               "store: a research run needs a run id of 1 "
                               "to %d bytes",
                               LOOM_ID_MAX);
    return 0;
}

int loom_store_research_put(loom_store *st, const loom_store_research_write *w)
{
    int rc;

    if (!st || !w)
        return loom__error_set(LOOM_EINVALID, "store: NULL argument");
    if ((rc = check_run_id(w->run_id)) != 0)
        return rc;
    if (w->spec && !w->conversation_id)
        return loom__error_set(LOOM_EINVALID, "store: a research run begins "
                                              "in a conversation");
    if (w->nmessages && !w->messages)
        return loom__error_set(LOOM_EINVALID, "store: NULL messages");
    if (w->event_seq && !w->event)
        return loom__error_set(LOOM_EINVALID, "store: an event without text");
    if (w->user_id &&
        (!*w->user_id || strlen(w->user_id) > LOOM_STORE_USER_ID_MAX))
        return loom__error_set(LOOM_EINVALID,
                               "store: a user id has 1 to %d bytes",
                               LOOM_STORE_USER_ID_MAX);
    return st->vt->research_put(st, w, loom__unix_ms());
}

int loom_store_research_get(loom_store *st, const char *run_id,
                            const char *user_id, int any_user, int events,
                            json_t **out)
{
    if (out)
        *out = NULL;
    if (!st || !out)
        return loom__error_set(LOOM_EINVALID, "store: NULL argument");
    if (check_run_id(run_id) != 0)
        return loom__error_set(LOOM_ENOTFOUND, "research run '%s' not found",
                               run_id ? run_id : "");
    return st->vt->research_get(st, run_id, user_id, any_user, events, out);
}

int loom_store_research_running(loom_store *st, json_t **out)
{
    if (out)
        *out = NULL;
    if (!st || !out)
        return loom__error_set(LOOM_EINVALID, "store: NULL argument");
    return st->vt->research_running(st, out);
}

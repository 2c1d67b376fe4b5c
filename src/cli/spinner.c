/*
 * The spinner line (spinner.h). A ticker thread redraws it under the
 * spinner's lock; holders erase it under the same lock, so a frame never
 * lands in the middle of someone else's output. The line is cut to the
 * terminal's width: a line that wrapped could not be redrawn in place.
 */
#include "cli/spinner.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

struct cli_spinner {
    FILE *f;
    pthread_mutex_t lock;
    pthread_cond_t wake; /* on CLOCK_MONOTONIC */
    pthread_t ticker;
    int stop, held, drawn;
    unsigned frame;
    char *id[SPINNER_MAX], *label[SPINNER_MAX];
    size_t n;     /* entries kept */
    size_t extra; /* started past SPINNER_MAX and not ended */
};

static const char frames[] = "-\\|/";

/* The terminal's width, 80 when it cannot say. */
static int width(FILE *f)
{
    struct winsize ws;

    if (ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    return 80;
}

/* Under the lock: erases the line if it is drawn. */
static void erase(cli_spinner *s)
{
    if (s->drawn) {
        fputs("\r\x1b[2K", s->f);
        fflush(s->f);
        s->drawn = 0;
    }
}

/* Under the lock: draws the line (the first entry's label, and how many
 * more run), cut to the width, or erases it when nothing runs. */
static void draw(cli_spinner *s)
{
    char more[48] = "";
    size_t total = s->n + s->extra, max, chars = 0, i;
    const char *label;

    if (s->held)
        return;
    if (!total) {
        erase(s);
        return;
    }
    label = s->n ? s->label[0] : "";
    if (total > 1)
        snprintf(more, sizeof(more), " (+%zu more)", total - 1);
    max = (size_t)width(s->f);
    max = max > strlen(more) + 4 ? max - strlen(more) - 4 : 0;
    for (i = 0; label[i]; i++)
        if (((unsigned char)label[i] & 0xC0) != 0x80 && ++chars > max)
            break;
    fprintf(s->f, "\r\x1b[2K%c %.*s%s", frames[s->frame % 4], (int)i, label,
            more);
    fflush(s->f);
    s->drawn = 1;
}

static void *tick(void *arg)
{
    cli_spinner *s = arg;
    struct timespec at;

    pthread_mutex_lock(&s->lock);
    while (!s->stop) {
        clock_gettime(CLOCK_MONOTONIC, &at);
        at.tv_nsec += SPINNER_TICK_MS * 1000000L;
        at.tv_sec += at.tv_nsec / 1000000000L;
        at.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&s->wake, &s->lock, &at);
        if (!s->stop && s->n + s->extra) {
            s->frame++;
            draw(s);
        }
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

int cli_spinner_new(cli_spinner **out, FILE *f)
{
    cli_spinner *s = calloc(1, sizeof(*s));
    pthread_condattr_t ca;

    *out = NULL;
    if (!s)
        return -1;
    s->f = f;
    pthread_mutex_init(&s->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->wake, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&s->ticker, NULL, tick, s) != 0) {
        pthread_cond_destroy(&s->wake);
        pthread_mutex_destroy(&s->lock);
        free(s);
        return -1;
    }
    *out = s;
    return 0;
}

void cli_spinner_free(cli_spinner *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    erase(s);
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->ticker, NULL);
    cli_spinner_clear(s);
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

void cli_spinner_hold(cli_spinner *s)
{
    pthread_mutex_lock(&s->lock);
    s->held = 1;
    erase(s);
    pthread_mutex_unlock(&s->lock);
}

void cli_spinner_release(cli_spinner *s)
{
    pthread_mutex_lock(&s->lock);
    s->held = 0;
    draw(s);
    pthread_mutex_unlock(&s->lock);
}

void cli_spinner_add(cli_spinner *s, const char *id, const char *label)
{
    char *i = NULL, *l = NULL;

    pthread_mutex_lock(&s->lock);
    if (s->n < SPINNER_MAX && (i = strdup(id)) && (l = strdup(label))) {
        s->id[s->n] = i;
        s->label[s->n++] = l;
    } else {
        free(i);
        s->extra++;
    }
    draw(s);
    pthread_mutex_unlock(&s->lock);
}

void cli_spinner_remove(cli_spinner *s, const char *id)
{
    size_t k;

    pthread_mutex_lock(&s->lock);
    for (k = 0; k < s->n && strcmp(s->id[k], id) != 0; k++)
        ;
    if (k < s->n) {
        free(s->id[k]);
        free(s->label[k]);
        memmove(&s->id[k], &s->id[k + 1], (s->n - k - 1) * sizeof(char *));
        memmove(&s->label[k], &s->label[k + 1],
                (s->n - k - 1) * sizeof(char *));
        s->n--;
    } else if (s->extra) {
        s->extra--;
    }
    draw(s);
    pthread_mutex_unlock(&s->lock);
}

void cli_spinner_clear(cli_spinner *s)
{
    pthread_mutex_lock(&s->lock);
    for (size_t k = 0; k < s->n; k++) {
        free(s->id[k]);
        free(s->label[k]);
    }
    s->n = 0;
    s->extra = 0;
    erase(s);
    pthread_mutex_unlock(&s->lock);
}

/*
 * The get_time built-in tool, and the small timezone reader it needs.
 *
 * Models do not know the current date; get_time tells them, in any IANA
 * timezone. Tools run on worker threads in parallel, and glibc has no
 * thread-safe per-call timezone API: localtime_r() reads the process-wide
 * TZ through tzset(), so the only way to ask it about another zone is to
 * change the environment, which races with every other thread (and
 * setenv() is not thread-safe at all). No installed library offers one
 * either, so the lookup is written by hand here: validate the zone name,
 * read /usr/share/zoneinfo/<name> (a TZif file, RFC 8536), find the UTC
 * offset in its transition table and, past the last transition, evaluate
 * the POSIX TZ rule in its footer (e.g. "CET-1CEST,M3.5.0,M10.5.0/3").
 * Everything is per call, on the stack or in one bounded heap buffer,
 * with bounds checks on every read: nothing is shared between threads.
 */
#include "core/clock.h"
#include "core/error.h"
#include "loom/tools.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ZONEINFO_DIR "/usr/share/zoneinfo"
#define ZONE_NAME_MAX 128
/* Real TZif files are a few KiB; anything this big is not one. */
#define TZIF_MAX_SIZE (256 * 1024)
#define FOOTER_MAX 255
#define DEFAULT_ZONE "UTC"

/*
 * Internal entry points, defined here and declared where used (builtins.c
 * and the unit tests); tools/ has no private header yet.
 */
int loom__tz_posix_offset(const char *tz, int64_t t, int32_t *utoff);
int loom__tzif_offset(const unsigned char *data, size_t len, int64_t t,
                      int32_t *utoff);
int loom__tz_offset(const char *zone, int64_t t, int32_t *utoff);
int loom__tz_offset_in(const char *dir, const char *zone, int64_t t,
                       int32_t *utoff);
int loom__tools_add_get_time(loom_tool_registry *reg);

/* ---- calendar arithmetic (proleptic Gregorian, days since 1970-01-01) */

static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;

    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* Howard Hinnant's days_from_civil, valid far beyond any time_t we see. */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    int64_t era, yoe, doy, doe;

    y -= m <= 2;
    era = floor_div(y, 400);
    yoe = y - era * 400;
    doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int64_t year_of_days(int64_t z)
{
    int64_t era, doe, yoe, doy, mp;

    z += 719468;
    era = floor_div(z, 146097);
    doe = z - era * 146097;
    yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    mp = (5 * doy + 2) / 153;
    return yoe + era * 400 + (mp >= 10);
}

static int is_leap(int64_t y)
{
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

/* ---- POSIX TZ strings (the TZif footer) */

typedef struct {
    char kind;     /* 'J': 1..365 without Feb 29, 'N': 0..365, 'M' */
    int day;       /* J and N: the day; M: weekday 0 (Sunday)..6 */
    int week;      /* M: 1..5, 5 meaning the last */
    int month;     /* M: 1..12 */
    int32_t time;  /* local seconds after midnight; may be <0 or >24h */
} tz_rule;

typedef struct {
    int32_t std_utoff; /* seconds east of UTC */
    int32_t dst_utoff;
    int has_dst;
    tz_rule start, end;
} tz_posix;

static int parse_num(const char **p, int max, int *out)
{
    int n = 0, digits = 0;

    while (**p >= '0' && **p <= '9') {
        n = n * 10 + (**p - '0');
        (*p)++;
        if (++digits > 3 || n > max)
            return -1;
    }
    if (!digits)
        return -1;
    *out = n;
    return 0;
}

/* A zone abbreviation: "CET" or a quoted "<+0330>". */
static int parse_abbr(const char **p)
{
    const char *s = *p;
    size_t n = 0;

    if (*s == '<') {
        for (s++; *s != '>'; s++, n++)
            if (!(*s == '+' || *s == '-' || (*s >= '0' && *s <= '9') ||
                  (*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z')))
                return -1;
        *p = s + 1;
        return n ? 0 : -1;
    }
    for (; (*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z'); s++)
        n++;
    *p = s;
    return n >= 3 ? 0 : -1;
}

/* [+-]hh[:mm[:ss]] into signed seconds; hours up to max_hours. */
static int parse_hms(const char **p, int max_hours, int32_t *out)
{
    int sign = 1, h, m = 0, s = 0;

    if (**p == '+' || **p == '-')
        sign = *(*p)++ == '-' ? -1 : 1;
    if (parse_num(p, max_hours, &h))
        return -1;
    if (**p == ':') {
        (*p)++;
        if (parse_num(p, 59, &m))
            return -1;
        if (**p == ':') {
            (*p)++;
            if (parse_num(p, 59, &s))
                return -1;
        }
    }
    *out = sign * (h * 3600 + m * 60 + s);
    return 0;
}

static int parse_rule(const char **p, tz_rule *r)
{
    r->time = 2 * 3600;
    if (**p == 'J') {
        (*p)++;
        r->kind = 'J';
        if (parse_num(p, 365, &r->day) || r->day < 1)
            return -1;
    } else if (**p == 'M') {
        (*p)++;
        r->kind = 'M';
        if (parse_num(p, 12, &r->month) || r->month < 1 || *(*p)++ != '.' ||
            parse_num(p, 5, &r->week) || r->week < 1 || *(*p)++ != '.' ||
            parse_num(p, 6, &r->day))
            return -1;
    } else {
        r->kind = 'N';
        if (parse_num(p, 365, &r->day))
            return -1;
    }
    if (**p == '/') {
        (*p)++;
        /* RFC 8536 extends the time to -167..167 hours. */
        if (parse_hms(p, 167, &r->time))
            return -1;
    }
    return 0;
}

static int parse_posix(const char *s, tz_posix *tz)
{
    const char *p = s;
    int32_t off;

    memset(tz, 0, sizeof(*tz));
    if (parse_abbr(&p) || parse_hms(&p, 24, &off))
        return -1;
    /* POSIX offsets count west of Greenwich: "EST5" is UTC-5. */
    tz->std_utoff = -off;
    if (*p == '\0')
        return 0;
    if (parse_abbr(&p))
        return -1;
    tz->has_dst = 1;
    tz->dst_utoff = tz->std_utoff + 3600;
    if (*p != ',' && *p != '\0') {
        if (parse_hms(&p, 24, &off))
            return -1;
        tz->dst_utoff = -off;
    }
    if (*p == '\0') {
        /* No rule: glibc (and POSIX's suggestion) use the US rules. */
        p = ",M3.2.0,M11.1.0";
    }
    if (*p++ != ',' || parse_rule(&p, &tz->start) || *p++ != ',' ||
        parse_rule(&p, &tz->end) || *p != '\0')
        return -1;
    return 0;
}

/* The UTC instant of a rule in year y, given the offset in force before. */
static int64_t rule_instant(const tz_rule *r, int64_t y, int32_t utoff)
{
    int64_t day;

    if (r->kind == 'J') {
        day = days_from_civil(y, 1, 1) + r->day - 1;
        if (is_leap(y) && r->day >= 60)
            day++;
    } else if (r->kind == 'N') {
        day = days_from_civil(y, 1, 1) + r->day;
    } else {
        int64_t first = days_from_civil(y, r->month, 1);
        int64_t next = r->month == 12 ? days_from_civil(y + 1, 1, 1)
                                      : days_from_civil(y, r->month + 1, 1);
        /* 1970-01-01 was a Thursday (4). */
        int64_t wday = ((first + 4) % 7 + 7) % 7;

        day = first + (r->day - wday + 7) % 7 + (int64_t)(r->week - 1) * 7;
        while (day >= next)
            day -= 7;
    }
    return day * 86400 + r->time - utoff;
}

/*
 * Whether DST is in force is decided within t's (UTC) year, as glibc and
 * the reference tz code do: when the start comes before the end, DST is
 * the span between them (northern hemisphere); otherwise it is the span
 * outside them (southern). "All year DST" rules such as
 * "EST5EDT4,0/0,J365/25" fall out of this too.
 */
static int32_t posix_offset_at(const tz_posix *tz, int64_t t)
{
    int64_t y, start, end;
    int dst;

    if (!tz->has_dst)
        return tz->std_utoff;
    y = year_of_days(floor_div(t, 86400));
    start = rule_instant(&tz->start, y, tz->std_utoff);
    end = rule_instant(&tz->end, y, tz->dst_utoff);
    if (start <= end)
        dst = t >= start && t < end;
    else
        dst = t < end || t >= start;
    return dst ? tz->dst_utoff : tz->std_utoff;
}

/*
 * Internal: the UTC offset (seconds east) at Unix time t under the POSIX
 * TZ string tz. 0, or LOOM_EPROTO when tz does not parse.
 */
int loom__tz_posix_offset(const char *tz, int64_t t, int32_t *utoff)
{
    tz_posix p;

    if (!tz || parse_posix(tz, &p))
        return loom__error_set(LOOM_EPROTO, "bad POSIX TZ string");
    *utoff = posix_offset_at(&p, t);
    return 0;
}

/* ---- TZif files (RFC 8536) */

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
           (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static int64_t be64(const unsigned char *p)
{
    return (int64_t)((uint64_t)be32(p) << 32 | be32(p + 4));
}

/* The i-th transition time of a block with tsize-byte (4 or 8) times. */
static int64_t time_at(const unsigned char *times, unsigned tsize, size_t i)
{
    if (tsize == 8)
        return be64(times + i * 8);
    return (int64_t)(int32_t)be32(times + i * 4);
}

typedef struct {
    uint32_t isutcnt, isstdcnt, leapcnt, timecnt, typecnt, charcnt;
    char version;
} tzif_header;

#define TZIF_HEADER_SIZE 44

static int read_header(const unsigned char *p, size_t len, tzif_header *h)
{
    if (len < TZIF_HEADER_SIZE || memcmp(p, "TZif", 4) != 0)
        return -1;
    h->version = (char)p[4];
    h->isutcnt = be32(p + 20);
    h->isstdcnt = be32(p + 24);
    h->leapcnt = be32(p + 28);
    h->timecnt = be32(p + 32);
    h->typecnt = be32(p + 36);
    h->charcnt = be32(p + 40);
    return 0;
}

/* Size of the data block after a header, with tsize-byte times. */
static uint64_t block_size(const tzif_header *h, unsigned tsize)
{
    return (uint64_t)h->timecnt * (tsize + 1) + (uint64_t)h->typecnt * 6 +
           h->charcnt + (uint64_t)h->leapcnt * (tsize + 4) + h->isstdcnt +
           h->isutcnt;
}

/*
 * Internal: the UTC offset (seconds east) at Unix time t according to the
 * TZif data. 0; LOOM_ENOTFOUND when data is not TZif at all; LOOM_EPROTO
 * when it is malformed or truncated.
 */
int loom__tzif_offset(const unsigned char *data, size_t len, int64_t t,
                      int32_t *utoff)
{
    tzif_header h;
    const unsigned char *p = data, *times, *idx, *types;
    unsigned tsize = 4;
    size_t rest = len, lo, hi, type;
    char footer[FOOTER_MAX + 1] = "";
    int32_t off;

    if (!data || read_header(p, rest, &h))
        return loom__error_set(LOOM_ENOTFOUND, "not a TZif file");
    if (h.version >= '2') {
        /* Skip the 32-bit block; the 64-bit one that follows is better. */
        uint64_t skip = TZIF_HEADER_SIZE + block_size(&h, 4);

        if (skip > rest)
            goto corrupt;
        p += skip;
        rest -= skip;
        if (read_header(p, rest, &h))
            goto corrupt;
        tsize = 8;
    }
    if (block_size(&h, tsize) > rest - TZIF_HEADER_SIZE || h.typecnt == 0)
        goto corrupt;
    p += TZIF_HEADER_SIZE;
    rest -= TZIF_HEADER_SIZE;
    times = p;
    idx = times + (size_t)h.timecnt * tsize;
    types = idx + h.timecnt;

    if (tsize == 8) {
        /* Footer: "\n" TZ-string "\n" right after the data block. */
        const unsigned char *f = p + block_size(&h, tsize);
        size_t frest = rest - block_size(&h, tsize), n = 0;

        if (frest < 2 || f[0] != '\n')
            goto corrupt;
        for (f++, frest--; n < frest && f[n] != '\n'; n++)
            if (n >= FOOTER_MAX || f[n] == '\0')
                goto corrupt;
        if (n == frest)
            goto corrupt;
        memcpy(footer, f, n);
        footer[n] = '\0';
    }

    if (footer[0] &&
        (h.timecnt == 0 || t > time_at(times, tsize, h.timecnt - 1))) {
        if (loom__tz_posix_offset(footer, t, utoff))
            goto corrupt;
        return 0;
    }
    if (h.timecnt == 0 || t < time_at(times, tsize, 0)) {
        /* RFC 8536: before the first transition, type 0 applies. */
        type = 0;
    } else {
        /* The last transition at or before t. */
        lo = 0;
        hi = h.timecnt;
        while (hi - lo > 1) {
            size_t mid = lo + (hi - lo) / 2;

            if (time_at(times, tsize, mid) <= t)
                lo = mid;
            else
                hi = mid;
        }
        type = idx[lo];
    }
    if (type >= h.typecnt)
        goto corrupt;
    off = (int32_t)be32(types + type * 6);
    /* RFC 8536 forbids this value; it also cannot be negated safely. */
    if (off == INT32_MIN)
        goto corrupt;
    *utoff = off;
    return 0;

corrupt:
    return loom__error_set(LOOM_EPROTO, "malformed TZif data");
}

/* [A-Za-z0-9_+-/], no "..", no leading '/', at most ZONE_NAME_MAX. */
static int zone_name_is_valid(const char *zone)
{
    size_t n = 0;

    if (!zone || zone[0] == '/' || strstr(zone, ".."))
        return 0;
    for (; zone[n]; n++) {
        char c = zone[n];

        if (n >= ZONE_NAME_MAX)
            return 0;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '+' || c == '-' ||
              c == '/'))
            return 0;
    }
    return n > 0;
}

static int unknown_zone(int code, const char *zone)
{
    return loom__error_set(code,
                           "unknown timezone '%.64s'; use an IANA name like "
                           "Europe/Paris", zone ? zone : "");
}

/* Reads the whole TZif file dir/zone into a new buffer. */
static int read_zone_file(const char *dir, const char *zone,
                          unsigned char **out, size_t *out_len)
{
    char path[PATH_MAX];
    unsigned char *data = NULL;
    struct stat st;
    size_t got = 0;
    int fd, len, rc = 0;

    *out = NULL;
    len = snprintf(path, sizeof(path), "%s/%s", dir, zone);
    if (len < 0 || (size_t)len >= sizeof(path))
        return loom__error_set(LOOM_EINVALID, "zoneinfo path too long");
    do {
        fd = open(path, O_RDONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return unknown_zone(LOOM_ENOTFOUND, zone);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        st.st_size < TZIF_HEADER_SIZE || st.st_size > TZIF_MAX_SIZE) {
        rc = unknown_zone(LOOM_ENOTFOUND, zone);
        goto cleanup;
    }
    data = malloc((size_t)st.st_size);
    if (!data) {
        rc = loom__error_oom();
        goto cleanup;
    }
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, data + got, (size_t)st.st_size - got);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            rc = loom__error_set(LOOM_EIO,
                                 "could not read timezone data for '%s'",
                                 zone);
            goto cleanup;
        }
        got += (size_t)n;
    }
    *out = data;
    *out_len = got;
    data = NULL;

cleanup:
    free(data);
    close(fd);
    return rc;
}

/*
 * Internal: the UTC offset (seconds east) of IANA zone at Unix time t,
 * reading zone files from dir (tests point it at a scratch directory).
 * LOOM_EINVALID for a malformed name, LOOM_ENOTFOUND for an unknown zone,
 * LOOM_EPROTO for a corrupt zone file; the message names the zone.
 */
int loom__tz_offset_in(const char *dir, const char *zone, int64_t t,
                       int32_t *utoff)
{
    unsigned char *data = NULL;
    size_t len = 0;
    int rc;

    if (!zone_name_is_valid(zone))
        return unknown_zone(LOOM_EINVALID, zone);
    /* Needs no tzdata, so it works even where none is installed. */
    if (strcmp(zone, "UTC") == 0) {
        *utoff = 0;
        return 0;
    }
    if ((rc = read_zone_file(dir, zone, &data, &len)) != 0)
        return rc;
    rc = loom__tzif_offset(data, len, t, utoff);
    if (rc == LOOM_ENOTFOUND)
        rc = unknown_zone(LOOM_ENOTFOUND, zone);
    else if (rc)
        rc = loom__error_set(rc, "timezone data for '%s' is corrupt", zone);
    free(data);
    return rc;
}

/* Internal: loom__tz_offset_in() on the system's zoneinfo directory. */
int loom__tz_offset(const char *zone, int64_t t, int32_t *utoff)
{
    return loom__tz_offset_in(ZONEINFO_DIR, zone, t, utoff);
}

/* ---- the tool */

static const char *const weekdays[] = {"Sunday",   "Monday", "Tuesday",
                                       "Wednesday", "Thursday", "Friday",
                                       "Saturday"};

/* "+01:00", "-03:30", or with seconds for old local mean times. */
static void format_offset(int32_t off, char *buf, size_t size)
{
    char sign = off < 0 ? '-' : '+';
    int32_t a = off < 0 ? -off : off;

    if (a % 60)
        snprintf(buf, size, "%c%02d:%02d:%02d", sign, (int)(a / 3600),
                 (int)(a / 60 % 60), (int)(a % 60));
    else
        snprintf(buf, size, "%c%02d:%02d", sign, (int)(a / 3600),
                 (int)(a / 60 % 60));
}

/* On failure the message goes both to out (what the model reads) and to
 * the thread's error. */
static int tool_fail(loom_buf *out, int code)
{
    loom_buf_clear(out);
    loom_buf_puts(out, loom_error_last());
    return code;
}

/* Whether zone is printable ASCII that JSON writes as it is (no quote,
 * backslash or control character; jansson leaves '/' alone). */
static int plain_zone(const char *zone)
{
    for (const unsigned char *p = (const unsigned char *)zone; *p; p++)
        if (*p < 0x20 || *p >= 0x7f || *p == '"' || *p == '\\')
            return 0;
    return 1;
}

static int get_time_execute(const json_t *args, const loom_tool_ctx *ctx,
                            loom_buf *out, void *payload)
{
    const char *zone = DEFAULT_ZONE;
    const json_t *v;
    json_t *result = NULL;
    char iso[64], offset[16], *text = NULL;
    struct tm tm;
    time_t now, local;
    int32_t off;
    int rc;

    (void)payload;
    v = ctx ? json_object_get(ctx->settings, "default_timezone") : NULL;
    if (v && !json_is_string(v))
        return tool_fail(out, loom__error_set(LOOM_EINVALID,
                         "setting default_timezone must be a string"));
    if (v && json_string_value(v)[0])
        zone = json_string_value(v);
    v = json_object_get(args, "timezone");
    if (v && !json_is_null(v) && !json_is_string(v))
        return tool_fail(out, loom__error_set(LOOM_EINVALID,
                         "`timezone` must be a string"));
    /* Models sometimes send "" for "no preference": use the default. */
    if (json_is_string(v) && json_string_value(v)[0])
        zone = json_string_value(v);

    now = (time_t)(loom__unix_ms() / 1000);
    if ((rc = loom__tz_offset(zone, (int64_t)now, &off)) != 0)
        return tool_fail(out, rc);

    local = now + off;
    if (!gmtime_r(&local, &tm))
        return tool_fail(out, loom__error_set(LOOM_ERROR,
                         "time out of range"));
    format_offset(off, offset, sizeof(offset));
    snprintf(iso, sizeof(iso), "%04d-%02d-%02dT%02d:%02d:%02d%s",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, offset);

    /* The usual zone needs no escaping: written as json_dumps would,
     * without building the object. */
    if (plain_zone(zone))
        return loom_buf_printf(out,
                               "{\"timezone\":\"%s\",\"iso\":\"%s\","
                               "\"unix\":%lld,\"utc_offset\":\"%s\","
                               "\"weekday\":\"%s\"}",
                               zone, iso, (long long)now, offset,
                               weekdays[tm.tm_wday % 7]);
    result = json_pack("{s:s, s:s, s:I, s:s, s:s}", "timezone", zone, "iso",
                       iso, "unix", (json_int_t)now, "utc_offset", offset,
                       "weekday", weekdays[tm.tm_wday % 7]);
    if (!result || !(text = json_dumps(result, JSON_COMPACT))) {
        rc = tool_fail(out, loom__error_oom());
        goto cleanup;
    }
    rc = loom_buf_puts(out, text);

cleanup:
    free(text);
    json_decref(result);
    return rc;
}

/* Internal: registers get_time (called by loom_tools_add_builtins). */
int loom__tools_add_get_time(loom_tool_registry *reg)
{
    loom_tool tool = {0};
    json_t *params;
    int rc;

    params = json_pack("{s:s, s:{s:{s:s, s:s}}, s:b}", "type", "object",
                       "properties", "timezone", "type", "string",
                       "description",
                       "IANA timezone name like Europe/Paris; default UTC",
                       "additionalProperties", 0);
    if (!params)
        return loom__error_oom();
    tool.name = "get_time";
    tool.description =
        "Get the current date and time. Returns the local time in ISO 8601 "
        "(iso), the Unix time (unix), the UTC offset (utc_offset) and the "
        "day of the week (weekday) for an IANA timezone. Use it whenever "
        "an answer depends on today's date or the current time.";
    tool.parameters = params;
    tool.execute = get_time_execute;
    rc = loom_tool_registry_add(reg, &tool);
    json_decref(params);
    return rc;
}

/*
 * `loom tokens [FILE|-]`: counts the tokens of a file or stdin with an
 * encoding (o200k_base by default) or for a model (loom/tokenizer.h), and
 * prints the count, optionally the ids. The input has a size limit
 * (--max-bytes). A hidden --bench N reports the fastest of N passes of
 * counting and of encoding after the vocabulary is loaded
 * (bench/tokenizer.sh uses it).
 */
#include "cli/cli.h"
#include "core/clock.h"
#include "loom/log.h"
#include "loom/tokenizer.h"

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_MAX_BYTES ((size_t)256 << 20)

static const char tokens_usage[] =
    "usage: loom tokens [options] [FILE|-]\n"
    "\n"
    "Counts the tokens of FILE (or stdin) as a model's tokenizer does and\n"
    "prints the count.\n"
    "\n"
    "options:\n"
    "  -e, --encoding ENC   o200k_base (default), cl100k_base, or the path\n"
    "                       of a .tiktoken rank file\n"
    "  -m, --model MODEL    count for a model (openai/gpt-4o,\n"
    "                       anthropic/claude-sonnet-4-5, ...): exact for\n"
    "                       OpenAI models, an estimate for others\n"
    "      --ids            print the token ids (one line, space separated)\n"
    "                       before the count\n"
    "      --special        read special-token text (<|endoftext|>, ...)\n"
    "                       as special tokens, not as plain text\n"
    "      --json           print one JSON object: encoding, model, exact,\n"
    "                       tokens (and ids with --ids)\n"
    "      --max-bytes N    refuse input over N bytes (default 256 MiB)\n"
    "  -h, --help           this help\n"
    "\n"
    "The vocabularies come from scripts/vocab.sh (docs/tokenizer.md);\n"
    "LOOM_VOCAB_DIR overrides where loom looks for them.\n"
    "\n"
    "exit codes: 0 done, 1 input unreadable or too large, 2 usage error or\n"
    "missing vocabulary\n";

typedef struct {
    const char *encoding, *model, *file;
    int ids, special, json;
    size_t max_bytes;
    long bench;
} tokens_args;

static int parse_size(const char *s, size_t max, size_t *out)
{
    char *end;
    unsigned long long v;

    if (!*s || *s == '-')
        return -1;
    v = strtoull(s, &end, 10);
    if (*end || v == 0 || v > max)
        return -1;
    *out = (size_t)v;
    return 0;
}

static int parse_args(tokens_args *a, int argc, char **argv)
{
    static const struct option opts[] = {
        {"encoding", required_argument, NULL, 'e'},
        {"model", required_argument, NULL, 'm'},
        {"ids", no_argument, NULL, 'i'},
        {"special", no_argument, NULL, 's'},
        {"json", no_argument, NULL, 'j'},
        {"max-bytes", required_argument, NULL, 'B'},
        {"bench", required_argument, NULL, 'N'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    size_t n;
    int c;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":e:m:h", opts, NULL)) != -1) {
        switch (c) {
        case 'e': a->encoding = optarg; break;
        case 'm': a->model = optarg; break;
        case 'i': a->ids = 1; break;
        case 's': a->special = 1; break;
        case 'j': a->json = 1; break;
        case 'B':
            if (parse_size(optarg, LOOM_TOKENIZER_MAX_INPUT,
                           &a->max_bytes) < 0) {
                fprintf(stderr, "loom tokens: --max-bytes must be a number "
                        "from 1 to %zu, got '%s'\n",
                        (size_t)LOOM_TOKENIZER_MAX_INPUT, optarg);
                return CLI_USAGE;
            }
            break;
        case 'N':
            if (parse_size(optarg, 100000, &n) < 0) {
                fprintf(stderr, "loom tokens: --bench must be a number from "
                        "1 to 100000, got '%s'\n", optarg);
                return CLI_USAGE;
            }
            a->bench = (long)n;
            break;
        case 'h':
            fputs(tokens_usage, stdout);
            return -1;
        default:
            return cli_getopt_fail("tokens", c, argv, tokens_usage);
        }
    }
    if (optind < argc)
        a->file = argv[optind++];
    if (optind < argc) {
        fprintf(stderr, "loom tokens: one input at most, got '%s' too\n\n%s",
                argv[optind], tokens_usage);
        return CLI_USAGE;
    }
    if (a->encoding && a->model) {
        fprintf(stderr, "loom tokens: give --encoding or --model, not "
                        "both\n");
        return CLI_USAGE;
    }
    if (!a->file && isatty(STDIN_FILENO)) {
        fprintf(stderr, "loom tokens: no input (give FILE, or - for "
                        "stdin)\n\n%s", tokens_usage);
        return CLI_USAGE;
    }
    return 0;
}

/* Reads all of f up to max bytes into *out. */
static int read_input(FILE *f, const char *what, size_t max, loom_buf *out)
{
    char chunk[65536];
    size_t n;

    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        if (loom_buf_put(out, chunk, n) < 0) {
            fprintf(stderr, "loom tokens: %s is larger than %zu bytes "
                    "(--max-bytes)\n", what, max);
            return CLI_FAILED;
        }
    }
    if (ferror(f)) {
        fprintf(stderr, "loom tokens: cannot read %s\n", what);
        return CLI_FAILED;
    }
    return 0;
}

/* --bench: the fastest of N passes of count, and of encode, over the
 * input (the fastest is the least disturbed by other work). */
static int bench(const loom_tokenizer *t, const loom_buf *in, long passes,
                 int special, double load_s)
{
    double t0, dt, count_s = 1e30, encode_s = 1e30;
    size_t tokens = 0, n = 0;
    uint32_t *ids = NULL;
    long i;

    for (i = 0; i < passes; i++) {
        t0 = loom__mono_ms_exact() / 1e3;
        tokens = loom_tokenizer_count(t, loom_buf_cstr(in), in->len);
        dt = loom__mono_ms_exact() / 1e3 - t0;
        count_s = dt < count_s ? dt : count_s;
        if (tokens == (size_t)-1) {
            fprintf(stderr, "loom tokens: %s\n", loom_error_last());
            return CLI_FAILED;
        }
    }
    for (i = 0; i < passes; i++) {
        free(ids);
        ids = NULL;
        t0 = loom__mono_ms_exact() / 1e3;
        if (loom_tokenizer_encode(t, loom_buf_cstr(in), in->len, special,
                                  &ids, &n) < 0) {
            fprintf(stderr, "loom tokens: %s\n", loom_error_last());
            return CLI_FAILED;
        }
        dt = loom__mono_ms_exact() / 1e3 - t0;
        encode_s = dt < encode_s ? dt : encode_s;
    }
    free(ids);
    printf("bench: %s: best of %ld passes over %zu bytes, %zu tokens; "
           "load %.1f ms; count %.2f MB/s; encode %.2f MB/s\n",
           loom_tokenizer_name(t), passes, in->len, tokens, load_s * 1e3,
           (double)in->len / count_s / 1e6,
           (double)in->len / encode_s / 1e6);
    return CLI_OK;
}

static int print_result(const tokens_args *a, const char *encoding,
                        int exact, size_t count, const uint32_t *ids,
                        size_t n)
{
    size_t i;

    if (a->json) {
        json_t *o = json_pack("{s:s,s:o,s:b,s:I}", "encoding", encoding,
                              "model", a->model ? json_string(a->model) :
                                                  json_null(),
                              "exact", exact, "tokens", (json_int_t)count);
        json_t *arr = a->ids ? json_array() : NULL;
        for (i = 0; arr && i < n; i++)
            json_array_append_new(arr, json_integer(ids[i]));
        if (arr)
            json_object_set_new(o, "ids", arr);
        if (!o || json_dumpf(o, stdout, JSON_COMPACT) < 0) {
            json_decref(o);
            fprintf(stderr, "loom tokens: cannot print the result\n");
            return CLI_FAILED;
        }
        json_decref(o);
        putchar('\n');
        return CLI_OK;
    }
    if (a->ids) {
        for (i = 0; i < n; i++)
            printf(i ? " %u" : "%u", ids[i]);
        putchar('\n');
    }
    printf("%zu\n", count);
    return CLI_OK;
}

int cli_tokens(int argc, char **argv)
{
    tokens_args a = {NULL, NULL, NULL, 0, 0, 0, DEFAULT_MAX_BYTES, 0};
    loom_buf in;
    loom_tokenizer *own = NULL;
    const loom_tokenizer *t = NULL;
    loom_token_counter *counter = NULL;
    uint32_t *ids = NULL;
    size_t n = 0, count;
    const char *encoding;
    double t0;
    int rc, exact = 1;
    FILE *f;

    loom_log_set(stderr, LOOM_LOG_WARN, LOOM_LOG_TEXT);
    rc = parse_args(&a, argc, argv);
    if (rc)
        return rc < 0 ? CLI_OK : rc;
    loom_buf_init(&in, a.max_bytes);
    if (!a.file || !strcmp(a.file, "-")) {
        rc = read_input(stdin, "stdin", a.max_bytes, &in);
    } else if (!(f = fopen(a.file, "rb"))) {
        fprintf(stderr, "loom tokens: cannot open %s\n", a.file);
        rc = CLI_FAILED;
    } else {
        rc = read_input(f, a.file, a.max_bytes, &in);
        fclose(f);
    }
    if (rc)
        goto cleanup;

    t0 = loom__mono_ms_exact() / 1e3;
    if (a.model) {
        if (loom_token_counter_for_model(&counter, a.model) < 0) {
            fprintf(stderr, "loom tokens: %s\n", loom_error_last());
            rc = CLI_USAGE;
            goto cleanup;
        }
        exact = loom_token_counter_is_exact(counter);
        encoding = loom_token_counter_method(counter);
        if (exact)
            t = loom_tokenizer_shared(encoding);
        else if (a.ids || a.bench) {
            fprintf(stderr, "loom tokens: %s: no exact tokenizer (counts "
                    "are estimates), so no ids\n", a.model);
            rc = CLI_USAGE;
            goto cleanup;
        }
    } else {
        if (loom_tokenizer_load(&own, a.encoding ? a.encoding :
                                                   "o200k_base") < 0) {
            fprintf(stderr, "loom tokens: %s\n", loom_error_last());
            rc = CLI_USAGE;
            goto cleanup;
        }
        t = own;
        encoding = loom_tokenizer_name(t);
    }
    if (a.bench) {
        rc =
            bench(t, &in, a.bench, a.special, loom__mono_ms_exact() / 1e3 - t0);
        goto cleanup;
    }
    if (!t) {
        count = loom_token_counter_text(counter, loom_buf_cstr(&in), in.len);
        fprintf(stderr, "loom tokens: %s: an estimate (%s, factor %.2f)\n",
                a.model, encoding, loom_token_counter_factor(counter));
    } else if (a.ids || a.special) {
        if (loom_tokenizer_encode(t, loom_buf_cstr(&in), in.len, a.special,
                                  &ids, &n) < 0) {
            fprintf(stderr, "loom tokens: %s\n", loom_error_last());
            rc = CLI_FAILED;
            goto cleanup;
        }
        count = n;
    } else {
        count = loom_tokenizer_count(t, loom_buf_cstr(&in), in.len);
        if (count == (size_t)-1) {
            fprintf(stderr, "loom tokens: %s\n", loom_error_last());
            rc = CLI_FAILED;
            goto cleanup;
        }
    }
    rc = print_result(&a, encoding, exact, count, ids, n);
cleanup:
    free(ids);
    loom_token_counter_free(counter);
    loom_tokenizer_free(own);
    loom_buf_free(&in);
    return rc;
}

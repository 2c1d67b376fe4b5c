/*
 * Unit tests of the network policy of the fetching tools
 * (src/tools/netguard.c), without any connection: a table of URLs that
 * must be refused (IPv4 in decimal, octal, hex and short spellings, IPv6
 * loopback, IPv4-mapped, IPv4-compatible, NAT64 and 6to4 forms,
 * link-local and metadata addresses, userinfo tricks, other schemes, odd
 * ports, names resolving to private addresses, a name with one public and
 * one private address), URLs that must pass with the addresses they are
 * pinned to, the allowlist (hosts, ports, wildcards, IP spellings), the
 * blocked-range messages, the socket-level check and every limit (URL
 * length, addresses per name, allowlist entries, ports). HTML to text is
 * tested in test_html_text.c, fetching in tests/integration.
 *
 * Names resolve through a test resolver installed with
 * loom__net_set_resolver: nothing here uses DNS.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/error.h"
#include "tools/netguard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PUB4 "93.184.216.34"
#define PUB6 "2606:2800:220:1:248:1893:25c8:1946"

/* ---- the test resolver */

static const struct {
    const char *name;
    const char *addrs[3];
} names[] = {
    {"public.test", {PUB4}},
    {"public6.test", {PUB6}},
    {"dual.test", {PUB4, PUB6}},
    {"private.test", {"10.1.2.3"}},
    {"mixed.test", {PUB4, "10.0.0.1"}},
    {"mixed6.test", {PUB6, "fd00::1"}},
    {"metadata.test", {"169.254.169.254"}},
    {"loop.test", {"127.0.0.1"}},
    {"mapped.test", {"::ffff:127.0.0.1"}},
    {"nat64.test", {"64:ff9b::a9fe:a9fe"}},
    {"localhost", {"127.0.0.1", "::1"}},
    {"wiki.internal", {"10.0.0.7"}},
    {"deep.wiki.internal", {"10.0.0.8"}},
    {"internal", {"10.0.0.9"}},
};

static int resolver_calls;

static int to_ss(const char *text, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof(*ss));
    if (inet_pton(AF_INET, text, &((struct sockaddr_in *)ss)->sin_addr) ==
        1) {
        ss->ss_family = AF_INET;
        return 0;
    }
    if (inet_pton(AF_INET6, text, &((struct sockaddr_in6 *)ss)->sin6_addr) ==
        1) {
        ss->ss_family = AF_INET6;
        return 0;
    }
    return -1;
}

static int test_resolve(const char *host, struct sockaddr_storage *addrs,
                        size_t max, size_t *n, void *payload)
{
    (void)payload;
    resolver_calls++;
    *n = 0;
    /* A name with more addresses than the guard keeps. */
    if (strcmp(host, "many.test") == 0) {
        for (size_t i = 0; i < 40 && *n < max; i++) {
            char text[32];

            snprintf(text, sizeof(text), "93.184.216.%zu", i + 1);
            assert_int_equal(to_ss(text, &addrs[(*n)++]), 0);
        }
        return 0;
    }
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(names[i].name, host) != 0)
            continue;
        for (size_t j = 0; j < 3 && names[i].addrs[j] && *n < max; j++)
            assert_int_equal(to_ss(names[i].addrs[j], &addrs[(*n)++]), 0);
        return 0;
    }
    return loom__error_set(LOOM_ENOTFOUND, "could not resolve host '%s'",
                           host);
}

static int setup(void **state)
{
    (void)state;
    loom__net_set_resolver(test_resolve, NULL);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    loom__net_set_resolver(NULL, NULL);
    return 0;
}

/* Checks url under p; returns the code, leaves the message in why. */
static int check(const loom__net_policy *p, const char *url,
                 loom__net_target *t)
{
    int rc = loom__net_target_check(t, p, url);

    if (rc == 0)
        assert_non_null(t->url);
    else
        assert_null(t->url);
    return rc;
}

/* ---- refused */

static const struct {
    const char *url;
    int code;
    const char *msg; /* a part of the message */
} refused[] = {
    /* IPv4 loopback in every spelling inet_aton reads */
    {"http://127.0.0.1/", LOOM_ERROR, "127.0.0.1 is in 127.0.0.0/8 (loopback)"},
    {"http://127.1/", LOOM_ERROR, "127.0.0.1 is in 127.0.0.0/8"},
    {"http://127.0.1/", LOOM_ERROR, "127.0.0.1 is in 127.0.0.0/8"},
    {"http://2130706433/", LOOM_ERROR, "127.0.0.1 is in 127.0.0.0/8"},
    {"http://0177.0.0.1/", LOOM_ERROR, "127.0.0.1 is in 127.0.0.0/8"},
    {"http://0x7f.1/", LOOM_ERROR, "127.0.0.1 is in 127.0.0.0/8"},
    {"http://0x7f000001/", LOOM_ERROR, "127.0.0.1 is in 127.0.0.0/8"},
    {"http://017700000001/", LOOM_ERROR, "127.0.0.1 is in 127.0.0.0/8"},
    {"http://0x7f.0x0.0x0.0x1/", LOOM_ERROR, "127.0.0.1 is in 127.0.0.0/8"},
    {"http://127.000.000.001/", LOOM_ERROR, "127.0.0.1 is in 127.0.0.0/8"},
    {"http://127.255.255.254:443/", LOOM_ERROR, "127.0.0.0/8"},
    /* "this" network */
    {"http://0/", LOOM_ERROR, "0.0.0.0 is in 0.0.0.0/8"},
    {"http://0.0.0.0/", LOOM_ERROR, "0.0.0.0 is in 0.0.0.0/8"},
    /* IPv6 loopback, unspecified and the forms that carry IPv4 */
    {"http://[::1]/", LOOM_ERROR, "::1 is the loopback address"},
    {"http://[::]/", LOOM_ERROR, "is the unspecified address"},
    {"http://[0:0:0:0:0:0:0:1]/", LOOM_ERROR, "loopback"},
    {"http://[::ffff:127.0.0.1]/", LOOM_ERROR,
     "IPv4-mapped address of 127.0.0.1, which is in 127.0.0.0/8"},
    {"http://[::ffff:7f00:1]/", LOOM_ERROR,
     "IPv4-mapped address of 127.0.0.1"},
    {"http://[0:0:0:0:0:ffff:127.0.0.1]/", LOOM_ERROR, "IPv4-mapped"},
    {"http://[::ffff:a9fe:a9fe]/", LOOM_ERROR, "of 169.254.169.254"},
    {"http://[64:ff9b::a9fe:a9fe]/", LOOM_ERROR,
     "NAT64 address of 169.254.169.254, which is in 169.254.0.0/16"},
    {"http://[64:ff9b::7f00:1]/", LOOM_ERROR, "NAT64 address of 127.0.0.1"},
    {"http://[64:ff9b:1::1]/", LOOM_ERROR, "64:ff9b:1::/48"},
    {"http://[::127.0.0.1]/", LOOM_ERROR, "IPv4-compatible address of "
                                          "127.0.0.1"},
    {"http://[2002:7f00:1::]/", LOOM_ERROR, "6to4 address of 127.0.0.1"},
    /* link-local and cloud metadata */
    {"http://169.254.169.254/latest/meta-data/", LOOM_ERROR,
     "169.254.169.254 is in 169.254.0.0/16 (link-local, cloud metadata)"},
    {"http://2852039166/", LOOM_ERROR, "169.254.169.254 is in"},
    {"http://[fe80::1]/", LOOM_ERROR, "fe80::/10 (link-local)"},
    {"http://[fe80::1%25eth0]/", LOOM_EINVALID, "zone"},
    {"http://[fd00::1]/", LOOM_ERROR, "fc00::/7 (unique local)"},
    {"http://[fc00::1]/", LOOM_ERROR, "fc00::/7"},
    {"http://[fec0::1]/", LOOM_ERROR, "fec0::/10"},
    {"http://[ff02::1]/", LOOM_ERROR, "ff00::/8 (multicast)"},
    {"http://[2001:db8::1]/", LOOM_ERROR, "2001:db8::/32"},
    /* private, shared and reserved IPv4 */
    {"http://10.0.0.1/", LOOM_ERROR, "10.0.0.0/8 (private network)"},
    {"http://172.16.0.1/", LOOM_ERROR, "172.16.0.0/12"},
    {"http://172.31.255.255/", LOOM_ERROR, "172.16.0.0/12"},
    {"http://192.168.1.1/", LOOM_ERROR, "192.168.0.0/16"},
    {"http://100.64.0.1/", LOOM_ERROR, "100.64.0.0/10 (carrier-grade NAT)"},
    {"http://100.127.255.255/", LOOM_ERROR, "100.64.0.0/10"},
    {"http://198.18.0.1/", LOOM_ERROR, "198.18.0.0/15"},
    {"http://198.19.255.255/", LOOM_ERROR, "198.18.0.0/15"},
    {"http://192.0.0.1/", LOOM_ERROR, "192.0.0.0/24"},
    {"http://224.0.0.1/", LOOM_ERROR, "224.0.0.0/4 (multicast)"},
    {"http://239.255.255.250/", LOOM_ERROR, "224.0.0.0/4"},
    {"http://240.0.0.1/", LOOM_ERROR, "240.0.0.0/4 (reserved)"},
    {"http://255.255.255.255/", LOOM_ERROR, "255.255.255.255/32 (broadcast)"},
    /* userinfo tricks */
    {"http://evil@127.0.0.1/", LOOM_EINVALID, "credentials"},
    {"http://public.test@127.0.0.1/", LOOM_EINVALID, "credentials"},
    {"http://user:pass@public.test/", LOOM_EINVALID, "credentials"},
    {"http://:@public.test/", LOOM_EINVALID, "credentials"},
    /* other schemes */
    {"ftp://public.test/", LOOM_EINVALID, "unsupported URL scheme 'ftp'"},
    {"file:///etc/passwd", LOOM_EINVALID, "unsupported URL scheme 'file'"},
    {"gopher://public.test/", LOOM_EINVALID, "scheme 'gopher'"},
    {"dict://127.0.0.1:11211/", LOOM_EINVALID, "scheme 'dict'"},
    {"javascript:alert(1)", LOOM_EINVALID, "scheme 'javascript'"},
    {"data:text/html,<h1>x</h1>", LOOM_EINVALID, "scheme 'data'"},
    {"//public.test/", LOOM_EINVALID, "must start with http"},
    {"public.test/path", LOOM_EINVALID, "must start with http"},
    {"", LOOM_EINVALID, "empty"},
    {"http://", LOOM_EINVALID, "not a valid URL"},
    {"http://exa mple.com/", LOOM_EINVALID, "not a valid URL"},
    /* odd ports */
    {"http://public.test:8080/", LOOM_ERROR, "port 8080 is not allowed"},
    {"http://public.test:22/", LOOM_ERROR, "port 22 is not allowed"},
    {"https://public.test:6379/", LOOM_ERROR, "port 6379"},
    {"http://93.184.216.34:25/", LOOM_ERROR, "port 25"},
    /* names that resolve to private addresses */
    {"http://private.test/", LOOM_ERROR,
     "host 'private.test' resolves to a blocked address: 10.1.2.3 is in "
     "10.0.0.0/8 (private network)"},
    {"http://mixed.test/", LOOM_ERROR,
     "'mixed.test' resolves to a blocked address: 10.0.0.1 is in "
     "10.0.0.0/8"},
    {"http://mixed6.test/", LOOM_ERROR, "fd00::1 is in fc00::/7"},
    {"http://metadata.test/", LOOM_ERROR, "169.254.169.254 is in"},
    {"http://loop.test/", LOOM_ERROR, "127.0.0.0/8"},
    {"http://mapped.test/", LOOM_ERROR, "IPv4-mapped address of 127.0.0.1"},
    {"http://nat64.test/", LOOM_ERROR, "NAT64 address of 169.254.169.254"},
    {"http://localhost/", LOOM_ERROR, "127.0.0.0/8"},
    {"http://LocalHost./", LOOM_ERROR, "127.0.0.0/8"},
    /* libcurl decodes a percent-encoded host; so does the check */
    {"http://%31%32%37.0.0.1/", LOOM_ERROR, "127.0.0.1 is in 127.0.0.0/8"},
    {"http://%6c%6f%63%61%6c%68%6f%73%74/", LOOM_ERROR, "127.0.0.0/8"},
    {"http://nxdomain.test/", LOOM_ENOTFOUND,
     "could not resolve host 'nxdomain.test'"},
};

static void test_refused_table(void **state)
{
    loom__net_policy p;
    loom__net_target t;

    (void)state;
    assert_true(sizeof(refused) / sizeof(refused[0]) >= 40);
    loom__net_policy_init(&p);
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        int rc = check(&p, refused[i].url, &t);

        if (rc != refused[i].code)
            fail_msg("%s: got %d (%s), want %d", refused[i].url, rc,
                     loom_error_last(), refused[i].code);
        if (refused[i].msg && !strstr(loom_error_last(), refused[i].msg))
            fail_msg("%s: message '%s' lacks '%s'", refused[i].url,
                     loom_error_last(), refused[i].msg);
        if (rc == LOOM_ERROR)
            assert_non_null(strstr(loom_error_last(), "blocked by policy"));
    }
}

/* IP literals in any spelling are never given to a resolver. */
static void test_literals_not_resolved(void **state)
{
    loom__net_policy p;
    loom__net_target t;

    (void)state;
    loom__net_policy_init(&p);
    resolver_calls = 0;
    assert_int_equal(check(&p, "http://0x7f.1/", &t), LOOM_ERROR);
    assert_int_equal(check(&p, "http://[::ffff:7f00:1]/", &t), LOOM_ERROR);
    assert_int_equal(check(&p, "http://" PUB4 "/", &t), 0);
    loom__net_target_clear(&t);
    assert_int_equal(resolver_calls, 0);
    assert_int_equal(check(&p, "http://public.test/", &t), 0);
    loom__net_target_clear(&t);
    assert_int_equal(resolver_calls, 1);
}

/* ---- allowed */

static void expect_addr(const loom__net_target *t, size_t i, const char *ip)
{
    struct sockaddr_storage ss;
    char text[INET6_ADDRSTRLEN];
    const void *a;

    assert_true(i < t->naddrs);
    assert_int_equal(to_ss(ip, &ss), 0);
    assert_int_equal(t->addrs[i].ss_family, ss.ss_family);
    a = t->addrs[i].ss_family == AF_INET
            ? (const void *)&((const struct sockaddr_in *)&t->addrs[i])
                  ->sin_addr
            : (const void *)&((const struct sockaddr_in6 *)&t->addrs[i])
                  ->sin6_addr;
    inet_ntop(t->addrs[i].ss_family, a, text, sizeof(text));
    assert_string_equal(text, ip);
}

static void test_allowed(void **state)
{
    loom__net_policy p;
    loom__net_target t;

    (void)state;
    loom__net_policy_init(&p);

    assert_int_equal(check(&p, "http://public.test/a?b=c#frag", &t), 0);
    assert_string_equal(t.url, "http://public.test/a?b=c");
    assert_string_equal(t.host, "public.test");
    assert_int_equal(t.port, 80);
    assert_false(t.literal);
    assert_false(t.allowlisted);
    assert_int_equal(t.naddrs, 1);
    expect_addr(&t, 0, PUB4);
    loom__net_target_clear(&t);

    assert_int_equal(check(&p, "https://public6.test/x", &t), 0);
    assert_int_equal(t.port, 443);
    expect_addr(&t, 0, PUB6);
    loom__net_target_clear(&t);

    assert_int_equal(check(&p, "http://dual.test/", &t), 0);
    assert_int_equal(t.naddrs, 2);
    expect_addr(&t, 0, PUB4);
    expect_addr(&t, 1, PUB6);
    loom__net_target_clear(&t);

    /* A public address in decimal is fetched in the dotted form. */
    assert_int_equal(check(&p, "http://1572395042/x", &t), 0);
    assert_string_equal(t.url, "http://" PUB4 "/x");
    assert_true(t.literal);
    expect_addr(&t, 0, PUB4);
    loom__net_target_clear(&t);

    assert_int_equal(check(&p, "https://[" PUB6 "]:443/", &t), 0);
    assert_true(t.literal);
    expect_addr(&t, 0, PUB6);
    loom__net_target_clear(&t);

    assert_int_equal(check(&p, "HTTP://PUBLIC.TEST/", &t), 0);
    expect_addr(&t, 0, PUB4);
    loom__net_target_clear(&t);

    assert_int_equal(check(&p, "http://public.test:443/", &t), 0);
    loom__net_target_clear(&t);
    loom__net_policy_clear(&p);
}

/* ---- the allowlist */

static void set_policy(loom__net_policy *p, const char *hosts,
                       const char *ports)
{
    json_t *h = hosts ? json_loads(hosts, 0, NULL) : NULL;
    json_t *po = ports ? json_loads(ports, 0, NULL) : NULL;

    loom__net_policy_init(p);
    assert_int_equal(loom__net_policy_set(p, h, po, "test"), 0);
    json_decref(h);
    json_decref(po);
}

static void test_allowlist(void **state)
{
    loom__net_policy p;
    loom__net_target t;

    (void)state;
    set_policy(&p, "[\"127.0.0.1:8080\", \"localhost\", \"*.internal\", "
                   "\"[::1]:9000\", \"2852039166\"]",
               NULL);
    /* host:port opens that port on that host */
    assert_int_equal(check(&p, "http://127.0.0.1:8080/", &t), 0);
    assert_true(t.allowlisted);
    expect_addr(&t, 0, "127.0.0.1");
    loom__net_target_clear(&t);
    assert_int_equal(check(&p, "http://0x7f.1:8080/", &t), 0);
    loom__net_target_clear(&t);
    /* ... and nothing else */
    assert_int_equal(check(&p, "http://127.0.0.1:8081/", &t), LOOM_ERROR);
    assert_non_null(strstr(loom_error_last(), "port 8081"));
    assert_int_equal(check(&p, "http://127.0.0.1/", &t), LOOM_ERROR);
    assert_non_null(strstr(loom_error_last(), "127.0.0.0/8"));
    /* a host without a port: any allowed port, still pinned */
    assert_int_equal(check(&p, "http://localhost/", &t), 0);
    assert_true(t.allowlisted);
    assert_int_equal(t.naddrs, 2);
    loom__net_target_clear(&t);
    assert_int_equal(check(&p, "http://localhost:8080/", &t), LOOM_ERROR);
    /* wildcards: names under the domain, not the domain itself */
    assert_int_equal(check(&p, "http://wiki.internal/", &t), 0);
    loom__net_target_clear(&t);
    assert_int_equal(check(&p, "https://deep.wiki.internal/", &t), 0);
    loom__net_target_clear(&t);
    assert_int_equal(check(&p, "http://internal/", &t), LOOM_ERROR);
    /* IPv6 with a port; an IP entry in another spelling */
    assert_int_equal(check(&p, "http://[::1]:9000/", &t), 0);
    loom__net_target_clear(&t);
    assert_int_equal(check(&p, "http://[::1]/", &t), LOOM_ERROR);
    assert_int_equal(check(&p, "http://169.254.169.254/", &t), 0);
    loom__net_target_clear(&t);
    /* the allowlist is by host: another name for the address is not in */
    assert_int_equal(check(&p, "http://metadata.test/", &t), LOOM_ERROR);
    loom__net_policy_clear(&p);

    /* allow_ports replaces 80 and 443 */
    set_policy(&p, NULL, "[8080]");
    assert_int_equal(check(&p, "http://public.test:8080/", &t), 0);
    loom__net_target_clear(&t);
    assert_int_equal(check(&p, "http://public.test/", &t), LOOM_ERROR);
    assert_non_null(strstr(loom_error_last(), "allowed ports: 8080"));
    loom__net_policy_clear(&p);
}

static void test_policy_errors(void **state)
{
    static const char *const bad[] = {
        "[\"\"]",          "[\"a b\"]",      "[\"http://x\"]",
        "[\"x:99999\"]",   "[\"x:0\"]",      "[\"*.\"]",
        "[\"[::1\"]",      "[\"*.1.2.3.4\"]", "[\"u@host\"]",
        "[\"x:80:90\"]",   "[42]",           "{\"a\":1}",
        "[\"[::1]x\"]",    "[\"host:\"]",    "[\"bad_char$\"]"};
    static const char *const bad_ports[] = {"[0]", "[65536]", "[\"80\"]",
                                            "80", "[1.5]"};
    loom__net_policy p;
    json_t *j, *many;
    char entry[32];

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        loom__net_policy_init(&p);
        j = json_loads(bad[i], 0, NULL);
        assert_non_null(j);
        if (loom__net_policy_set(&p, j, NULL, "tools.web_fetch") !=
            LOOM_EINVALID)
            fail_msg("allow_hosts %s was accepted", bad[i]);
        assert_non_null(strstr(loom_error_last(), "tools.web_fetch"));
        assert_int_equal(p.hosts_len, 0);
        json_decref(j);
    }
    for (size_t i = 0; i < sizeof(bad_ports) / sizeof(bad_ports[0]); i++) {
        loom__net_policy_init(&p);
        j = json_loads(bad_ports[i], JSON_DECODE_ANY, NULL);
        assert_non_null(j);
        if (loom__net_policy_set(&p, NULL, j, "t") != LOOM_EINVALID)
            fail_msg("allow_ports %s was accepted", bad_ports[i]);
        assert_int_equal(p.ports_len, 2); /* unchanged */
        json_decref(j);
    }

    /* LOOM__NET_MAX_ALLOW_HOSTS entries pass, one more does not. */
    many = json_array();
    for (int i = 0; i < LOOM__NET_MAX_ALLOW_HOSTS; i++) {
        snprintf(entry, sizeof(entry), "h%d.internal", i);
        json_array_append_new(many, json_string(entry));
    }
    loom__net_policy_init(&p);
    assert_int_equal(loom__net_policy_set(&p, many, NULL, "t"), 0);
    assert_int_equal(p.hosts_len, LOOM__NET_MAX_ALLOW_HOSTS);
    loom__net_policy_clear(&p);
    json_array_append_new(many, json_string("one-more.internal"));
    assert_int_equal(loom__net_policy_set(&p, many, NULL, "t"),
                     LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "more than 256"));
    assert_int_equal(p.hosts_len, 0);
    json_decref(many);

    /* LOOM__NET_MAX_PORTS ports pass, one more does not. */
    many = json_array();
    for (int i = 0; i < LOOM__NET_MAX_PORTS; i++)
        json_array_append_new(many, json_integer(8000 + i));
    assert_int_equal(loom__net_policy_set(&p, NULL, many, "t"), 0);
    assert_int_equal(p.ports_len, LOOM__NET_MAX_PORTS);
    json_array_append_new(many, json_integer(9999));
    assert_int_equal(loom__net_policy_set(&p, NULL, many, "t"),
                     LOOM_EINVALID);
    assert_int_equal(p.ports_len, LOOM__NET_MAX_PORTS);
    json_decref(many);
    loom__net_policy_clear(&p);
}

/* ---- limits */

static void test_url_length_limit(void **state)
{
    loom__net_policy p;
    loom__net_target t;
    char *url = malloc(LOOM__NET_MAX_URL + 2);
    size_t pre = strlen("http://public.test/");

    (void)state;
    loom__net_policy_init(&p);
    memcpy(url, "http://public.test/", pre);
    memset(url + pre, 'a', LOOM__NET_MAX_URL - pre);
    url[LOOM__NET_MAX_URL] = '\0';
    assert_int_equal(check(&p, url, &t), 0);
    loom__net_target_clear(&t);
    url[LOOM__NET_MAX_URL] = 'a';
    url[LOOM__NET_MAX_URL + 1] = '\0';
    assert_int_equal(check(&p, url, &t), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "longer than 8192"));
    free(url);
}

static void test_addresses_limit(void **state)
{
    loom__net_policy p;
    loom__net_target t;

    (void)state;
    loom__net_policy_init(&p);
    assert_int_equal(check(&p, "http://many.test/", &t), 0);
    assert_int_equal(t.naddrs, LOOM__NET_MAX_ADDRS);
    expect_addr(&t, LOOM__NET_MAX_ADDRS - 1, "93.184.216.16");
    loom__net_target_clear(&t);
}

/* ---- the address checks */

static int blocked(const char *ip, char *why, size_t cap)
{
    struct sockaddr_storage ss;

    assert_int_equal(to_ss(ip, &ss), 0);
    return loom__net_addr_blocked((struct sockaddr *)&ss, why, cap);
}

static void test_addr_blocked(void **state)
{
    static const char *const open_[] = {
        PUB4, PUB6, "8.8.8.8", "1.1.1.1", "172.15.255.255", "172.32.0.0",
        "100.63.255.255", "100.128.0.0", "192.167.255.255", "198.17.255.255",
        "198.20.0.0", "223.255.255.255", "169.253.255.255", "11.0.0.0",
        "::ffff:8.8.8.8", "64:ff9b::808:808", "2001:4860:4860::8888",
        "fbff::1", "fe7f::1"};
    char why[256];

    (void)state;
    for (size_t i = 0; i < sizeof(open_) / sizeof(open_[0]); i++)
        if (blocked(open_[i], why, sizeof(why)))
            fail_msg("%s is public but blocked: %s", open_[i], why);
    assert_true(blocked("10.255.255.255", why, sizeof(why)));
    assert_string_equal(why, "10.255.255.255 is in 10.0.0.0/8 (private "
                             "network)");
    assert_true(blocked("::ffff:192.168.0.1", why, sizeof(why)));
    assert_string_equal(why, "::ffff:192.168.0.1 is an IPv4-mapped address "
                             "of 192.168.0.1, which is in 192.168.0.0/16 "
                             "(private network)");
    /* A short buffer cuts the message, never overflows. */
    assert_true(blocked("127.0.0.1", why, 8));
    assert_int_equal(strlen(why), 7);
}

/* The socket-level check: only the pinned addresses, on the URL's port. */
static void test_target_refuses(void **state)
{
    loom__net_policy p;
    loom__net_target t;
    struct sockaddr_in in;
    struct sockaddr_in6 in6;
    char why[256];

    (void)state;
    loom__net_policy_init(&p);
    assert_int_equal(check(&p, "http://dual.test/", &t), 0);
    memset(&in, 0, sizeof(in));
    in.sin_family = AF_INET;
    in.sin_port = htons(80);
    inet_pton(AF_INET, PUB4, &in.sin_addr);
    assert_int_equal(loom__net_target_refuses(&t, (struct sockaddr *)&in,
                                              sizeof(in), why, sizeof(why)),
                     0);
    memset(&in6, 0, sizeof(in6));
    in6.sin6_family = AF_INET6;
    in6.sin6_port = htons(80);
    inet_pton(AF_INET6, PUB6, &in6.sin6_addr);
    assert_int_equal(loom__net_target_refuses(&t, (struct sockaddr *)&in6,
                                              sizeof(in6), why, sizeof(why)),
                     0);
    /* another port */
    in.sin_port = htons(8080);
    assert_int_equal(loom__net_target_refuses(&t, (struct sockaddr *)&in,
                                              sizeof(in), why, sizeof(why)),
                     1);
    assert_non_null(strstr(why, "not an address checked"));
    /* another public address: what a second lookup could have given */
    in.sin_port = htons(80);
    inet_pton(AF_INET, "8.8.8.8", &in.sin_addr);
    assert_int_equal(loom__net_target_refuses(&t, (struct sockaddr *)&in,
                                              sizeof(in), why, sizeof(why)),
                     1);
    /* a private one: named as such */
    inet_pton(AF_INET, "10.0.0.1", &in.sin_addr);
    assert_int_equal(loom__net_target_refuses(&t, (struct sockaddr *)&in,
                                              sizeof(in), why, sizeof(why)),
                     1);
    assert_non_null(strstr(why, "10.0.0.0/8"));
    /* a truncated address */
    assert_int_equal(loom__net_target_refuses(&t, (struct sockaddr *)&in6,
                                              sizeof(in), why, sizeof(why)),
                     1);
    loom__net_target_clear(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_table),
        cmocka_unit_test(test_literals_not_resolved),
        cmocka_unit_test(test_allowed),
        cmocka_unit_test(test_allowlist),
        cmocka_unit_test(test_policy_errors),
        cmocka_unit_test(test_url_length_limit),
        cmocka_unit_test(test_addresses_limit),
        cmocka_unit_test(test_addr_blocked),
        cmocka_unit_test(test_target_refuses),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}

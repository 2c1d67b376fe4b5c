/*
 * Heap accounting for `loom-bench-mem fanout --memory` (built only into
 * the loom-bench-mem target, with LOOM_BENCH_MEMORY defined): malloc,
 * calloc, realloc, free and the aligned allocators are replaced by
 * versions that call glibc's own (__libc_malloc...) and keep the bytes
 * live (malloc_usable_size of each block, all threads, every library
 * linked in: libloom, libcurl, jansson) and their high-water mark, which
 * the bench resets before a run to learn that run's peak. In loom-bench
 * itself these functions are plain stubs answering 0, so its timed and
 * callgrind figures never pay for the accounting.
 */
#include "bench.h"

#ifdef LOOM_BENCH_MEMORY
#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stddef.h>

void *__libc_malloc(size_t size);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t size);
void *__libc_memalign(size_t align, size_t size);
void __libc_free(void *p);

static atomic_long live;
static atomic_long peak;

static void *took(void *p)
{
    if (p) {
        long now = atomic_fetch_add(&live, (long)malloc_usable_size(p)) +
                   (long)malloc_usable_size(p);
        long hi = atomic_load(&peak);

        while (now > hi && !atomic_compare_exchange_weak(&peak, &hi, now))
            ;
    }
    return p;
}

static void gives(void *p)
{
    if (p)
        atomic_fetch_sub(&live, (long)malloc_usable_size(p));
}

void *malloc(size_t size)
{
    return took(__libc_malloc(size));
}

void *calloc(size_t n, size_t size)
{
    return took(__libc_calloc(n, size));
}

void *realloc(void *p, size_t size)
{
    void *q;

    gives(p);
    q = __libc_realloc(p, size);
    if (!q && p && size) {
        took(p); /* failed: p is still live */
        return NULL;
    }
    return took(q);
}

void free(void *p)
{
    gives(p);
    __libc_free(p);
}

void *memalign(size_t align, size_t size)
{
    return took(__libc_memalign(align, size));
}

void *aligned_alloc(size_t align, size_t size)
{
    return took(__libc_memalign(align, size));
}

int posix_memalign(void **out, size_t align, size_t size)
{
    void *p = __libc_memalign(align, size);

    if (!p)
        return ENOMEM;
    *out = took(p);
    return 0;
}

int bench_mem_enabled(void)
{
    return 1;
}

long bench_mem_live(void)
{
    return atomic_load(&live);
}

long bench_mem_reset_peak(void)
{
    long now = atomic_load(&live);

    atomic_store(&peak, now);
    return now;
}

long bench_mem_peak(void)
{
    return atomic_load(&peak);
}
#else
int bench_mem_enabled(void)
{
    return 0;
}

long bench_mem_live(void)
{
    return 0;
}

long bench_mem_reset_peak(void)
{
    return 0;
}

long bench_mem_peak(void)
{
    return 0;
}
#endif

// libevent's allocations through a small per-thread cache of the buffer blocks a socket read
// takes (see CShims.h, sluice_event_cache_buffer_blocks).
#include "CShims.h"
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <event2/event.h>

// The block sizes cached: an evbuffer chain is a power of two of at least 1,024 bytes, and the
// ones a read reserves (ClientSocket.smallRead, 4,032 bytes and the chain's header) and a 1 KiB
// response's output take are 4,096 and 2,048 bytes: too large for glibc's per-thread cache
// (1,032 bytes at most), so each went through malloc's and free's slow paths.
enum { CLASSES = 2, CACHED_PER_CLASS = 8 };
static const size_t class_bytes[CLASSES] = {2048, 4096};
// What malloc_usable_size says of a block of each class (measured once): a block freed with
// exactly that usable size is one of the class, whoever allocated it.
static size_t class_usable[CLASSES];

struct block_cache {
    void *blocks[CLASSES][CACHED_PER_CLASS];
    int count[CLASSES];
    int registered;
};
static __thread struct block_cache cache;
static pthread_key_t exit_key;

// A thread that ends gives its cached blocks back to malloc.
static void release_thread_cache(void *unused) {
    (void)unused;
    for (int c = 0; c < CLASSES; c++) {
        while (cache.count[c] > 0) free(cache.blocks[c][--cache.count[c]]);
    }
}

void sluice_event_release_cached_blocks(void) { release_thread_cache(NULL); }

static int class_of_request(size_t n) {
    for (int c = 0; c < CLASSES; c++) {
        if (n == class_bytes[c]) return c;
    }
    return -1;
}

static void *cached_malloc(size_t n) {
    int c = class_of_request(n);
    if (c >= 0 && cache.count[c] > 0) return cache.blocks[c][--cache.count[c]];
    return malloc(n);
}

static void *cached_realloc(void *p, size_t n) { return realloc(p, n); }

static void cached_free(void *p) {
    if (!p) return;
    size_t usable = malloc_usable_size(p);
    for (int c = 0; c < CLASSES; c++) {
        if (usable != class_usable[c] || cache.count[c] >= CACHED_PER_CLASS) continue;
        if (!cache.registered) {
            // The key's value only makes its destructor run when this thread ends.
            cache.registered = 1;
            pthread_setspecific(exit_key, &cache);
        }
        cache.blocks[c][cache.count[c]++] = p;
        return;
    }
    free(p);
}

static pthread_once_t setup_once = PTHREAD_ONCE_INIT;

static void setup(void) {
    for (int c = 0; c < CLASSES; c++) {
        void *probe = malloc(class_bytes[c]);
        class_usable[c] = malloc_usable_size(probe);
        free(probe);
    }
    pthread_key_create(&exit_key, release_thread_cache);
    event_set_mem_functions(cached_malloc, cached_realloc, cached_free);
}

void sluice_event_cache_buffer_blocks(void) { pthread_once(&setup_once, setup); }

int sluice_event_cached_blocks(void) {
    int n = 0;
    for (int c = 0; c < CLASSES; c++) n += cache.count[c];
    return n;
}

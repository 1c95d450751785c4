// libcurl opened on first use (curl_api.h says why), and the `sluice_curl_*` functions Swift
// calls instead of libcurl's own names: each goes through the table, loading it first.
#include "CShims.h"
#include "curl_api.h"
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

/// The SONAME Debian's libcurl4 (the OpenSSL flavour the headers come from) installs.
static const char *const library_name = "libcurl.so.4";

static struct sluice_curl_api api;
static pthread_once_t api_once = PTHREAD_ONCE_INIT;
static _Atomic int api_loaded;

static void *symbol(void *library, const char *name) {
    void *found = dlsym(library, name);
    if (!found) {
        fprintf(stderr, "sluice: %s has no %s: %s\n", library_name, name, dlerror());
        abort();
    }
    return found;
}

static void load(void) {
    void *library = dlopen(library_name, RTLD_NOW | RTLD_LOCAL);
    if (!library) {
        fprintf(stderr, "sluice: cannot load %s (the libcurl4 package): %s\n", library_name, dlerror());
        abort();
    }
    // Each pointer's type is the field's: dlsym's void * converted as POSIX allows.
#define LOAD(field, name) *(void **)&api.field = symbol(library, name)
    LOAD(global_init, "curl_global_init");
    LOAD(version_info, "curl_version_info");
    LOAD(easy_init, "curl_easy_init");
    LOAD(easy_cleanup, "curl_easy_cleanup");
    LOAD(easy_reset, "curl_easy_reset");
    LOAD(easy_pause, "curl_easy_pause");
    LOAD(easy_send, "curl_easy_send");
    LOAD(easy_recv, "curl_easy_recv");
    LOAD(easy_strerror, "curl_easy_strerror");
    LOAD(easy_setopt, "curl_easy_setopt");
    LOAD(easy_getinfo, "curl_easy_getinfo");
    LOAD(multi_init, "curl_multi_init");
    LOAD(multi_cleanup, "curl_multi_cleanup");
    LOAD(multi_add_handle, "curl_multi_add_handle");
    LOAD(multi_remove_handle, "curl_multi_remove_handle");
    LOAD(multi_socket_action, "curl_multi_socket_action");
    LOAD(multi_info_read, "curl_multi_info_read");
    LOAD(multi_setopt, "curl_multi_setopt");
    LOAD(share_init, "curl_share_init");
    LOAD(share_setopt, "curl_share_setopt");
    LOAD(share_cleanup, "curl_share_cleanup");
    LOAD(slist_append, "curl_slist_append");
    LOAD(slist_free_all, "curl_slist_free_all");
#undef LOAD
    api.global_init(CURL_GLOBAL_ALL);
    api_loaded = 1;
}

const struct sluice_curl_api *sluice_curl(void) {
    pthread_once(&api_once, load);
    return &api;
}

int sluice_curl_loaded(void) { return api_loaded; }

CURL *sluice_curl_easy_init(void) { return sluice_curl()->easy_init(); }
void sluice_curl_easy_cleanup(CURL *h) { sluice_curl()->easy_cleanup(h); }
void sluice_curl_easy_reset(CURL *h) { sluice_curl()->easy_reset(h); }
CURLcode sluice_curl_easy_pause(CURL *h, int bitmask) { return sluice_curl()->easy_pause(h, bitmask); }
CURLcode sluice_curl_easy_send(CURL *h, const void *buffer, size_t length, size_t *sent) {
    return sluice_curl()->easy_send(h, buffer, length, sent);
}
CURLcode sluice_curl_easy_recv(CURL *h, void *buffer, size_t length, size_t *received) {
    return sluice_curl()->easy_recv(h, buffer, length, received);
}
const char *sluice_curl_easy_strerror(CURLcode code) { return sluice_curl()->easy_strerror(code); }
CURLM *sluice_curl_multi_init(void) { return sluice_curl()->multi_init(); }
CURLMcode sluice_curl_multi_cleanup(CURLM *m) { return sluice_curl()->multi_cleanup(m); }
CURLMcode sluice_curl_multi_add_handle(CURLM *m, CURL *h) { return sluice_curl()->multi_add_handle(m, h); }
CURLMcode sluice_curl_multi_remove_handle(CURLM *m, CURL *h) { return sluice_curl()->multi_remove_handle(m, h); }
CURLMcode sluice_curl_multi_socket_action(CURLM *m, curl_socket_t s, int ev_bitmask, int *running) {
    return sluice_curl()->multi_socket_action(m, s, ev_bitmask, running);
}
CURLMsg *sluice_curl_multi_info_read(CURLM *m, int *queued) { return sluice_curl()->multi_info_read(m, queued); }
CURLSHcode sluice_curl_share_cleanup(CURLSH *s) { return sluice_curl()->share_cleanup(s); }
struct curl_slist *sluice_curl_slist_append(struct curl_slist *list, const char *string) {
    return sluice_curl()->slist_append(list, string);
}
void sluice_curl_slist_free_all(struct curl_slist *list) { sluice_curl()->slist_free_all(list); }

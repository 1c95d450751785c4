#ifndef SLUICE_CURL_API_H
#define SLUICE_CURL_API_H
// libcurl's functions as CShims calls them: pointers into the library that curl_loader.c
// opens (dlopen) on the first call, so that a process that never uses libcurl never maps it
// and its dependencies (GnuTLS, Kerberos, LDAP, ssh2…: 4.4 MiB resident at rest, measured in
// BENCHMARKS.md). Private to CShims; Swift calls the `sluice_curl_*` functions of CShims.h.
#include <curl/curl.h>

struct sluice_curl_api {
    CURLcode (*global_init)(long flags);
    curl_version_info_data *(*version_info)(CURLversion version);
    CURL *(*easy_init)(void);
    void (*easy_cleanup)(CURL *h);
    void (*easy_reset)(CURL *h);
    CURLcode (*easy_pause)(CURL *h, int bitmask);
    CURLcode (*easy_send)(CURL *h, const void *buffer, size_t length, size_t *sent);
    CURLcode (*easy_recv)(CURL *h, void *buffer, size_t length, size_t *received);
    const char *(*easy_strerror)(CURLcode code);
    CURLcode (*easy_setopt)(CURL *h, CURLoption option, ...);
    CURLcode (*easy_getinfo)(CURL *h, CURLINFO info, ...);
    CURLM *(*multi_init)(void);
    CURLMcode (*multi_cleanup)(CURLM *m);
    CURLMcode (*multi_add_handle)(CURLM *m, CURL *h);
    CURLMcode (*multi_remove_handle)(CURLM *m, CURL *h);
    CURLMcode (*multi_socket_action)(CURLM *m, curl_socket_t s, int ev_bitmask, int *running);
    CURLMsg *(*multi_info_read)(CURLM *m, int *queued);
    CURLMcode (*multi_setopt)(CURLM *m, CURLMoption option, ...);
    CURLSH *(*share_init)(void);
    CURLSHcode (*share_setopt)(CURLSH *s, CURLSHoption option, ...);
    CURLSHcode (*share_cleanup)(CURLSH *s);
    struct curl_slist *(*slist_append)(struct curl_slist *list, const char *string);
    void (*slist_free_all)(struct curl_slist *list);
};

/// The library's functions, opened and `curl_global_init`-ed on the first call from any
/// thread (pthread_once). The process ends with a message when libcurl cannot be opened.
const struct sluice_curl_api *sluice_curl(void);

#endif

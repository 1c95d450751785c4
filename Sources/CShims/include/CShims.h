#ifndef SLUICE_CSHIMS_H
#define SLUICE_CSHIMS_H
// Typed wrappers for the C calls Swift cannot import: libcurl's variadic setopt/getinfo
// functions, and a share handle whose lock callbacks live here, in C, so no Swift code
// runs under curl's share locks.
#include <sys/types.h>
#include <curl/curl.h>

typedef size_t (*sluice_data_cb)(char *ptr, size_t size, size_t nmemb, void *userdata);
typedef int (*sluice_socket_cb)(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp);
typedef int (*sluice_timer_cb)(CURLM *multi, long timeout_ms, void *userp);
typedef int (*sluice_seek_cb)(void *userp, curl_off_t offset, int origin);
typedef curl_socket_t (*sluice_opensocket_cb)(void *clientp, curlsocktype purpose, struct curl_sockaddr *address);

CURLcode sluice_easy_setopt_long(CURL *h, CURLoption opt, long value);
CURLcode sluice_easy_setopt_off(CURL *h, CURLoption opt, curl_off_t value);
CURLcode sluice_easy_setopt_ptr(CURL *h, CURLoption opt, void *value);
CURLcode sluice_easy_setopt_str(CURL *h, CURLoption opt, const char *value);
CURLcode sluice_easy_setopt_data_cb(CURL *h, CURLoption opt, sluice_data_cb cb);
CURLcode sluice_easy_setopt_opensocket_cb(CURL *h, sluice_opensocket_cb cb);
CURLcode sluice_easy_setopt_seek_cb(CURL *h, sluice_seek_cb cb);

CURLcode sluice_easy_getinfo_long(CURL *h, CURLINFO info, long *out);
CURLcode sluice_easy_getinfo_off(CURL *h, CURLINFO info, curl_off_t *out);
CURLcode sluice_easy_getinfo_ptr(CURL *h, CURLINFO info, void **out);
CURLcode sluice_easy_getinfo_socket(CURL *h, curl_socket_t *out);

CURLMcode sluice_multi_setopt_long(CURLM *m, CURLMoption opt, long value);
CURLMcode sluice_multi_setopt_ptr(CURLM *m, CURLMoption opt, void *value);
CURLMcode sluice_multi_setopt_socket_cb(CURLM *m, sluice_socket_cb cb);
CURLMcode sluice_multi_setopt_timer_cb(CURLM *m, sluice_timer_cb cb);

/// A share handle for DNS cache and TLS sessions, safe to use from every worker thread
/// (one pthread mutex per curl_lock_data). Created once per process; never freed.
CURLSH *sluice_share_create(void);

/// CURLAUTH_BASIC | CURLAUTH_DIGEST (a macro with a cast Swift cannot import).
long sluice_curlauth_basic_digest(void);

/// The libcurl version string, e.g. "7.88.1".
const char *sluice_curl_version(void);

#endif

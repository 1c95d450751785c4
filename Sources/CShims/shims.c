#include "CShims.h"
#include <pthread.h>
#include <stdlib.h>

CURLcode sluice_easy_setopt_long(CURL *h, CURLoption opt, long value) { return curl_easy_setopt(h, opt, value); }
CURLcode sluice_easy_setopt_off(CURL *h, CURLoption opt, curl_off_t value) { return curl_easy_setopt(h, opt, value); }
CURLcode sluice_easy_setopt_ptr(CURL *h, CURLoption opt, void *value) { return curl_easy_setopt(h, opt, value); }
CURLcode sluice_easy_setopt_str(CURL *h, CURLoption opt, const char *value) { return curl_easy_setopt(h, opt, value); }
CURLcode sluice_easy_setopt_data_cb(CURL *h, CURLoption opt, sluice_data_cb cb) { return curl_easy_setopt(h, opt, cb); }
CURLcode sluice_easy_setopt_opensocket_cb(CURL *h, sluice_opensocket_cb cb) { return curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, cb); }
CURLcode sluice_easy_setopt_seek_cb(CURL *h, sluice_seek_cb cb) { return curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, cb); }

CURLcode sluice_easy_getinfo_long(CURL *h, CURLINFO info, long *out) { return curl_easy_getinfo(h, info, out); }
CURLcode sluice_easy_getinfo_off(CURL *h, CURLINFO info, curl_off_t *out) { return curl_easy_getinfo(h, info, out); }
CURLcode sluice_easy_getinfo_ptr(CURL *h, CURLINFO info, void **out) { return curl_easy_getinfo(h, info, out); }
CURLcode sluice_easy_getinfo_socket(CURL *h, curl_socket_t *out) { return curl_easy_getinfo(h, CURLINFO_ACTIVESOCKET, out); }

CURLMcode sluice_multi_setopt_long(CURLM *m, CURLMoption opt, long value) { return curl_multi_setopt(m, opt, value); }
CURLMcode sluice_multi_setopt_ptr(CURLM *m, CURLMoption opt, void *value) { return curl_multi_setopt(m, opt, value); }
CURLMcode sluice_multi_setopt_socket_cb(CURLM *m, sluice_socket_cb cb) { return curl_multi_setopt(m, CURLMOPT_SOCKETFUNCTION, cb); }
CURLMcode sluice_multi_setopt_timer_cb(CURLM *m, sluice_timer_cb cb) { return curl_multi_setopt(m, CURLMOPT_TIMERFUNCTION, cb); }

static pthread_mutex_t share_locks[CURL_LOCK_DATA_LAST];

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *userp) {
    (void)h; (void)access; (void)userp;
    pthread_mutex_lock(&share_locks[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *userp) {
    (void)h; (void)userp;
    pthread_mutex_unlock(&share_locks[data]);
}

CURLSH *sluice_share_create(void) {
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++) pthread_mutex_init(&share_locks[i], NULL);
    CURLSH *share = curl_share_init();
    if (!share) return NULL;
    curl_share_setopt(share, CURLSHOPT_LOCKFUNC, share_lock);
    curl_share_setopt(share, CURLSHOPT_UNLOCKFUNC, share_unlock);
    curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    return share;
}

const char *sluice_curl_version(void) {
    return curl_version_info(CURLVERSION_NOW)->version;
}

long sluice_curlauth_basic_digest(void) { return (long)(CURLAUTH_BASIC | CURLAUTH_DIGEST); }

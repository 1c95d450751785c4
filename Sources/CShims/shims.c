// ppoll (the real poll behind the interposed one below) is a GNU extension.
#define _GNU_SOURCE
#include "CShims.h"
#include "curl_api.h"
#include <poll.h>
#include <pthread.h>
#include <malloc.h>
#include <sys/eventfd.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <event2/bufferevent_ssl.h>
#include <openssl/err.h>

CURLcode sluice_easy_setopt_long(CURL *h, CURLoption opt, long value) { return sluice_curl()->easy_setopt(h, opt, value); }
CURLcode sluice_easy_setopt_off(CURL *h, CURLoption opt, curl_off_t value) { return sluice_curl()->easy_setopt(h, opt, value); }
CURLcode sluice_easy_setopt_ptr(CURL *h, CURLoption opt, void *value) { return sluice_curl()->easy_setopt(h, opt, value); }
CURLcode sluice_easy_setopt_str(CURL *h, CURLoption opt, const char *value) { return sluice_curl()->easy_setopt(h, opt, value); }
CURLcode sluice_easy_setopt_data_cb(CURL *h, CURLoption opt, sluice_data_cb cb) { return sluice_curl()->easy_setopt(h, opt, cb); }
CURLcode sluice_easy_setopt_opensocket_cb(CURL *h, sluice_opensocket_cb cb) { return sluice_curl()->easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, cb); }
CURLcode sluice_easy_setopt_seek_cb(CURL *h, sluice_seek_cb cb) { return sluice_curl()->easy_setopt(h, CURLOPT_SEEKFUNCTION, cb); }
CURLcode sluice_easy_setopt_closesocket_cb(CURL *h, sluice_closesocket_cb cb) { return sluice_curl()->easy_setopt(h, CURLOPT_CLOSESOCKETFUNCTION, cb); }
CURLcode sluice_easy_setopt_prereq_cb(CURL *h, sluice_prereq_cb cb) { return sluice_curl()->easy_setopt(h, CURLOPT_PREREQFUNCTION, cb); }

// One byte per descriptor below the table's size: 1 = quiet (see CShims.h). Sized once from
// RLIMIT_NOFILE (at least 64 Ki entries); descriptors beyond it are never marked.
static _Atomic(atomic_uchar *) quiet_table;
static size_t quiet_table_size;  // written before quiet_table is published
static pthread_once_t quiet_once = PTHREAD_ONCE_INIT;

static void quiet_table_init(void) {
    size_t n = 65536;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur > n) {
        n = rl.rlim_cur > (1u << 24) ? (1u << 24) : (size_t)rl.rlim_cur;
    }
    atomic_uchar *table = calloc(n, sizeof *table);
    if (!table) return;
    quiet_table_size = n;
    atomic_store_explicit(&quiet_table, table, memory_order_release);
}

void sluice_socket_set_quiet(int fd, int quiet) {
    pthread_once(&quiet_once, quiet_table_init);
    atomic_uchar *table = atomic_load_explicit(&quiet_table, memory_order_acquire);
    if (!table || fd < 0 || (size_t)fd >= quiet_table_size) return;
    atomic_store_explicit(&table[fd], quiet ? 1 : 0, memory_order_relaxed);
}

// libcurl's liveness and "anything to read?" checks are poll(one fd, POLLIN..., 0 ms). This
// definition in the executable takes precedence over libc's for every caller in the process
// (libcurl's calls bind to it); see sluice_socket_set_quiet.
int poll(struct pollfd *fds, nfds_t nfds, int timeout) {
    const short readOnly = POLLIN | POLLPRI | POLLRDNORM | POLLRDBAND;
    atomic_uchar *table = atomic_load_explicit(&quiet_table, memory_order_acquire);
    if (nfds == 1 && timeout == 0 && fds && table) {
        int fd = fds[0].fd;
        if (fd >= 0 && (size_t)fd < quiet_table_size && (fds[0].events & ~readOnly) == 0
            && atomic_load_explicit(&table[fd], memory_order_relaxed)) {
            fds[0].revents = 0;
            return 0;
        }
    }
    struct timespec ts;
    struct timespec *limit = NULL;
    if (timeout >= 0) {
        ts.tv_sec = timeout / 1000;
        ts.tv_nsec = (long)(timeout % 1000) * 1000000L;
        limit = &ts;
    }
    return ppoll(fds, nfds, limit, NULL);
}

CURLcode sluice_easy_getinfo_long(CURL *h, CURLINFO info, long *out) { return sluice_curl()->easy_getinfo(h, info, out); }
CURLcode sluice_easy_getinfo_off(CURL *h, CURLINFO info, curl_off_t *out) { return sluice_curl()->easy_getinfo(h, info, out); }
CURLcode sluice_easy_getinfo_ptr(CURL *h, CURLINFO info, void **out) { return sluice_curl()->easy_getinfo(h, info, out); }
CURLcode sluice_easy_getinfo_socket(CURL *h, curl_socket_t *out) { return sluice_curl()->easy_getinfo(h, CURLINFO_ACTIVESOCKET, out); }

CURLMcode sluice_multi_setopt_long(CURLM *m, CURLMoption opt, long value) { return sluice_curl()->multi_setopt(m, opt, value); }
CURLMcode sluice_multi_setopt_ptr(CURLM *m, CURLMoption opt, void *value) { return sluice_curl()->multi_setopt(m, opt, value); }
CURLMcode sluice_multi_setopt_socket_cb(CURLM *m, sluice_socket_cb cb) { return sluice_curl()->multi_setopt(m, CURLMOPT_SOCKETFUNCTION, cb); }
CURLMcode sluice_multi_setopt_timer_cb(CURLM *m, sluice_timer_cb cb) { return sluice_curl()->multi_setopt(m, CURLMOPT_TIMERFUNCTION, cb); }

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
    CURLSH *share = sluice_curl()->share_init();
    if (!share) return NULL;
    sluice_curl()->share_setopt(share, CURLSHOPT_LOCKFUNC, share_lock);
    sluice_curl()->share_setopt(share, CURLSHOPT_UNLOCKFUNC, share_unlock);
    sluice_curl()->share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    sluice_curl()->share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    return share;
}

const char *sluice_curl_version(void) {
    return sluice_curl()->version_info(CURLVERSION_NOW)->version;
}

const char *sluice_curl_cainfo(void) { return sluice_curl()->version_info(CURLVERSION_NOW)->cainfo; }
const char *sluice_curl_capath(void) { return sluice_curl()->version_info(CURLVERSION_NOW)->capath; }

long sluice_curlauth_basic_digest(void) { return (long)(CURLAUTH_BASIC | CURLAUTH_DIGEST); }

CURLcode sluice_easy_setopt_ssl_ctx_cb(CURL *h, sluice_ssl_ctx_cb cb) { return sluice_curl()->easy_setopt(h, CURLOPT_SSL_CTX_FUNCTION, cb); }

struct verifier_arg {
    void *arg;
    sluice_release_cb release;
};

static void verifier_arg_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl, void *argp) {
    (void)parent; (void)ad; (void)idx; (void)argl; (void)argp;
    struct verifier_arg *v = ptr;
    if (!v) return;
    if (v->release) v->release(v->arg);
    free(v);
}

static int verifier_index = -1;
static pthread_once_t verifier_once = PTHREAD_ONCE_INIT;
static void verifier_index_init(void) {
    verifier_index = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, verifier_arg_free);
}

int sluice_ssl_ctx_set_verifier(SSL_CTX *ctx, sluice_cert_verify_cb cb, void *arg, sluice_release_cb release) {
    pthread_once(&verifier_once, verifier_index_init);
    if (verifier_index < 0) return 0;
    struct verifier_arg *v = malloc(sizeof *v);
    if (!v) return 0;
    v->arg = arg;
    v->release = release;
    struct verifier_arg *old = SSL_CTX_get_ex_data(ctx, verifier_index);
    if (!SSL_CTX_set_ex_data(ctx, verifier_index, v)) {
        free(v);
        return 0;
    }
    if (old) verifier_arg_free(ctx, old, NULL, verifier_index, 0, NULL);
    SSL_CTX_set_cert_verify_callback(ctx, cb, arg);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    return 1;
}

struct bufferevent *sluice_bufferevent_ssl_accept(struct event_base *base, evutil_socket_t fd, SSL *ssl) {
    return bufferevent_openssl_socket_new(base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
}

void sluice_bufferevent_ssl_shutdown(struct bufferevent *bev) {
    SSL *ssl = bufferevent_openssl_get_ssl(bev);
    if (ssl && SSL_is_init_finished(ssl)) {
        SSL_shutdown(ssl);
        ERR_clear_error();
    }
}

unsigned long sluice_bufferevent_ssl_error(struct bufferevent *bev) {
    return bufferevent_get_openssl_error(bev);
}

void sluice_ssl_ctx_server_defaults(SSL_CTX *ctx) {
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    // No resumption: the certificate callback (which enforces SNI == CONNECT host) must run
    // on every handshake.
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_NO_TICKET);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
}

void sluice_ssl_ctx_client_defaults(SSL_CTX *ctx) {
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    // No tickets: sessions are never resumed (every handshake runs the trust evaluator).
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION | SSL_OP_NO_TICKET);
    SSL_CTX_set_read_ahead(ctx, 1);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
    // Sessions are not resumed: every connection's handshake runs the trust evaluator.
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
}

int sluice_ssl_set_sni(SSL *ssl, const char *name) { return (int)SSL_set_tlsext_host_name(ssl, name); }

static int passphrase_index = -1;
static pthread_once_t passphrase_once = PTHREAD_ONCE_INIT;
static void passphrase_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl, void *argp) {
    (void)parent; (void)ad; (void)idx; (void)argl; (void)argp;
    if (ptr) { OPENSSL_cleanse(ptr, strlen(ptr)); free(ptr); }
}
static void passphrase_index_init(void) {
    passphrase_index = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, passphrase_free);
}
static int passphrase_cb(char *buf, int size, int rwflag, void *userdata) {
    (void)rwflag;
    const char *pass = userdata;
    if (!pass || size <= 0) return 0;
    size_t n = strlen(pass);
    if (n > (size_t)size) n = (size_t)size;
    memcpy(buf, pass, n);
    return (int)n;
}
int sluice_ssl_ctx_set_key_passphrase(SSL_CTX *ctx, const char *passphrase) {
    if (!passphrase) return 1;
    pthread_once(&passphrase_once, passphrase_index_init);
    if (passphrase_index < 0) return 0;
    char *copy = strdup(passphrase);
    if (!copy || !SSL_CTX_set_ex_data(ctx, passphrase_index, copy)) { free(copy); return 0; }
    SSL_CTX_set_default_passwd_cb(ctx, passphrase_cb);
    SSL_CTX_set_default_passwd_cb_userdata(ctx, copy);
    return 1;
}

void sluice_set_thread_name(const char *name) { pthread_setname_np(pthread_self(), name); }
void sluice_name_thread(pthread_t thread, const char *name) { pthread_setname_np(thread, name); }

int sluice_easy_speaks_h2(CURL *h) {
    long version = 0;
    if (sluice_curl()->easy_getinfo(h, CURLINFO_HTTP_VERSION, &version) == CURLE_OK && version == CURL_HTTP_VERSION_2_0) {
        return 1;
    }
    struct curl_tlssessioninfo *info = NULL;
    if (sluice_curl()->easy_getinfo(h, CURLINFO_TLS_SSL_PTR, &info) != CURLE_OK || info == NULL
        || info->backend != CURLSSLBACKEND_OPENSSL || info->internals == NULL) {
        return 0;
    }
    const unsigned char *alpn = NULL;
    unsigned int length = 0;
    SSL_get0_alpn_selected((SSL *)info->internals, &alpn, &length);
    return length == 2 && alpn[0] == 'h' && alpn[1] == '2';
}

int sluice_heap_trim(void) {
    return malloc_trim(0);
}

int sluice_wake_fd(void) {
    return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

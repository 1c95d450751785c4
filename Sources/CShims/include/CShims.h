#ifndef SLUICE_CSHIMS_H
#define SLUICE_CSHIMS_H
// Typed wrappers for the C calls Swift cannot import: libcurl's variadic setopt/getinfo
// functions, and a share handle whose lock callbacks live here, in C, so no Swift code
// runs under curl's share locks. libcurl itself is opened on first use (curl_loader.c).
#include <sys/types.h>
#include <pthread.h>
#include <curl/curl.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <event2/event.h>
#include <event2/bufferevent.h>

typedef size_t (*sluice_data_cb)(char *ptr, size_t size, size_t nmemb, void *userdata);
typedef int (*sluice_socket_cb)(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp);
typedef int (*sluice_timer_cb)(CURLM *multi, long timeout_ms, void *userp);
typedef int (*sluice_seek_cb)(void *userp, curl_off_t offset, int origin);
typedef curl_socket_t (*sluice_opensocket_cb)(void *clientp, curlsocktype purpose, struct curl_sockaddr *address);
typedef int (*sluice_closesocket_cb)(void *clientp, curl_socket_t item);
typedef int (*sluice_prereq_cb)(void *clientp, char *conn_primary_ip, char *conn_local_ip, int conn_primary_port, int conn_local_port);

CURLcode sluice_easy_setopt_long(CURL *h, CURLoption opt, long value);
CURLcode sluice_easy_setopt_off(CURL *h, CURLoption opt, curl_off_t value);
CURLcode sluice_easy_setopt_ptr(CURL *h, CURLoption opt, void *value);
CURLcode sluice_easy_setopt_str(CURL *h, CURLoption opt, const char *value);
CURLcode sluice_easy_setopt_data_cb(CURL *h, CURLoption opt, sluice_data_cb cb);
CURLcode sluice_easy_setopt_opensocket_cb(CURL *h, sluice_opensocket_cb cb);
CURLcode sluice_easy_setopt_seek_cb(CURL *h, sluice_seek_cb cb);
CURLcode sluice_easy_setopt_closesocket_cb(CURL *h, sluice_closesocket_cb cb);
/// CURLOPT_PREREQFUNCTION: called each time a request is about to be sent (libcurl >= 7.80).
CURLcode sluice_easy_setopt_prereq_cb(CURL *h, sluice_prereq_cb cb);

/// Readiness hints for the upstream sockets an event loop watches on libcurl's behalf.
///
/// libcurl 7.88 asks `poll(fd, 0 ms)` about a pooled connection before every reuse (is it
/// dead?) and again right after sending a request (is the answer there already?): two
/// system calls per proxied request whose answers the event loop already knows, because
/// it keeps every pooled socket registered for readability (see `UpstreamSession`). A
/// socket marked quiet is one the loop watches for reading and that has reported nothing
/// since libcurl last read it; Sluice's `poll` (below, which libcurl's calls bind to)
/// answers "nothing to read" for such a socket without entering the kernel. Every other
/// call (more than one descriptor, a timeout, write interest, an unmarked socket) is the
/// real `poll`. A "nothing" that is stale by a loop iteration is corrected by the loop's
/// next readiness report, which libcurl then receives as a socket action.
///
/// Marks are per descriptor, process-wide; the worker thread that owns a socket sets and
/// clears its mark, and clears it before the descriptor is closed.
void sluice_socket_set_quiet(int fd, int quiet);

typedef CURLcode (*sluice_ssl_ctx_cb)(CURL *easy, void *ssl_ctx, void *userptr);
CURLcode sluice_easy_setopt_ssl_ctx_cb(CURL *h, sluice_ssl_ctx_cb cb);

typedef int (*sluice_cert_verify_cb)(X509_STORE_CTX *store, void *arg);
typedef void (*sluice_release_cb)(void *arg);
/// Makes `cb` the certificate verification of `ctx` (SSL_CTX_set_cert_verify_callback) and
/// turns SSL_VERIFY_PEER on, so its verdict fails the handshake. `arg` stays valid for as
/// long as `ctx` lives: `release(arg)` runs when OpenSSL frees `ctx` (ex_data free callback).
int sluice_ssl_ctx_set_verifier(SSL_CTX *ctx, sluice_cert_verify_cb cb, void *arg, sluice_release_cb release);

/// A TLS server bufferevent on socket `fd` (libevent's bufferevent_openssl), accepting. It
/// owns `ssl` and `fd` (frees and closes them with itself). On failure (NULL), libevent
/// has already freed `ssl`.
struct bufferevent *sluice_bufferevent_ssl_accept(struct event_base *base, evutil_socket_t fd, SSL *ssl);
/// The most recent OpenSSL error recorded on a TLS bufferevent, 0 if none.
unsigned long sluice_bufferevent_ssl_error(struct bufferevent *bev);
/// Sends TLS close_notify on a TLS bufferevent, best effort (non-blocking).
void sluice_bufferevent_ssl_shutdown(struct bufferevent *bev);

/// SSL_CTX_set_options / SSL_CTX_set_min_proto_version (macros).
void sluice_ssl_ctx_server_defaults(SSL_CTX *ctx);
/// The native transport's client context settings (macros): TLS 1.2 at least, no
/// renegotiation, compression or session tickets, read-ahead (one read per batch of records, not two per
/// record), partial writes from a moving buffer (an evbuffer's chains), and buffers released
/// while a connection is idle.
void sluice_ssl_ctx_client_defaults(SSL_CTX *ctx);
/// SSL_set_tlsext_host_name (a macro): the SNI name of a client `SSL`.
int sluice_ssl_set_sni(SSL *ssl, const char *name);
/// Makes `passphrase` the password callback's answer for `ctx`'s key files (copied; NULL: none).
int sluice_ssl_ctx_set_key_passphrase(SSL_CTX *ctx, const char *passphrase);

CURLcode sluice_easy_getinfo_long(CURL *h, CURLINFO info, long *out);
CURLcode sluice_easy_getinfo_off(CURL *h, CURLINFO info, curl_off_t *out);
CURLcode sluice_easy_getinfo_ptr(CURL *h, CURLINFO info, void **out);
CURLcode sluice_easy_getinfo_socket(CURL *h, curl_socket_t *out);

CURLMcode sluice_multi_setopt_long(CURLM *m, CURLMoption opt, long value);
CURLMcode sluice_multi_setopt_ptr(CURLM *m, CURLMoption opt, void *value);
CURLMcode sluice_multi_setopt_socket_cb(CURLM *m, sluice_socket_cb cb);
CURLMcode sluice_multi_setopt_timer_cb(CURLM *m, sluice_timer_cb cb);

/// A share handle for DNS cache and TLS sessions, safe to use from every worker thread
/// (one pthread mutex per curl_lock_data). Made by a server's first libcurl session
/// (`CurlShare`), freed by the server once its workers are gone.
CURLSH *sluice_share_create(void);

/// CURLAUTH_BASIC | CURLAUTH_DIGEST (a macro with a cast Swift cannot import).
long sluice_curlauth_basic_digest(void);

/// The transfer runs on an HTTP/2 connection: its response said so (CURLINFO_HTTP_VERSION),
/// or, before any response, its TLS connection selected `h2` by ALPN. 0 for HTTP/1.x, for
/// plain-http connections before a response (prior knowledge is the caller's to know), and
/// for a transfer without a connection.
int sluice_easy_speaks_h2(CURL *h);

/// libcurl's functions under names of Sluice's own: libcurl is not linked but opened on the
/// first call of any of them (or of the other curl shims here) from any thread, then
/// `curl_global_init`-ed (curl_loader.c), so that a process whose tries never reach libcurl
/// never maps it and its dependencies. Each does what the libcurl function of the same name
/// without `sluice_` does.
CURL *sluice_curl_easy_init(void);
void sluice_curl_easy_cleanup(CURL *h);
void sluice_curl_easy_reset(CURL *h);
CURLcode sluice_curl_easy_pause(CURL *h, int bitmask);
CURLcode sluice_curl_easy_send(CURL *h, const void *buffer, size_t length, size_t *sent);
CURLcode sluice_curl_easy_recv(CURL *h, void *buffer, size_t length, size_t *received);
const char *sluice_curl_easy_strerror(CURLcode code);
CURLM *sluice_curl_multi_init(void);
CURLMcode sluice_curl_multi_cleanup(CURLM *m);
CURLMcode sluice_curl_multi_add_handle(CURLM *m, CURL *h);
CURLMcode sluice_curl_multi_remove_handle(CURLM *m, CURL *h);
CURLMcode sluice_curl_multi_socket_action(CURLM *m, curl_socket_t s, int ev_bitmask, int *running);
CURLMsg *sluice_curl_multi_info_read(CURLM *m, int *queued);
CURLSHcode sluice_curl_share_cleanup(CURLSH *s);
struct curl_slist *sluice_curl_slist_append(struct curl_slist *list, const char *string);
void sluice_curl_slist_free_all(struct curl_slist *list);
/// 1 once libcurl has been opened (by any of the calls above), else 0. Opens nothing.
int sluice_curl_loaded(void);

/// The libcurl version string, e.g. "7.88.1".
const char *sluice_curl_version(void);
/// libcurl's built-in CA bundle and directory (NULL when it has none).
const char *sluice_curl_cainfo(void);
const char *sluice_curl_capath(void);

/// Names the calling thread (15 bytes at most; `ps -L`, `top -H`, /proc/self/task/*/comm).
void sluice_set_thread_name(const char *name);
/// Names another thread (pthread_setname_np, which Swift's Glibc module does not export).
void sluice_name_thread(pthread_t thread, const char *name);

/// glibc's malloc_trim(0): gives the free whole pages inside every malloc arena back to the
/// kernel (<malloc.h>, which Swift's Glibc module does not export). Returns 1 if any were.
int sluice_heap_trim(void);

/// A non-blocking, close-on-exec eventfd with a zero count (<sys/eventfd.h>, which Swift's
/// Glibc module does not export): a `LoopWake` that other threads write. -1 and errno on failure.
int sluice_wake_fd(void);


/// Routes libevent's allocations through a per-thread cache of at most 8 blocks of each of the
/// two sizes an evbuffer chain has for a socket read and a small response (2 and 4 KiB): glibc
/// serves blocks up to 1,032 bytes from its own per-thread cache, and these took the slow paths
/// of malloc and free several times a request. Every block is glibc's (a cached one is simply
/// not freed yet), so memory libevent allocated before the call is freed as before. Call before
/// the event loops start (later calls do nothing); a thread's cached blocks are freed when it ends.
void sluice_event_cache_buffer_blocks(void);
/// Frees the calling thread's cached blocks (before a heap trim: a quiet worker keeps none).
void sluice_event_release_cached_blocks(void);
/// How many blocks the calling thread's cache holds (for tests).
int sluice_event_cached_blocks(void);

#endif

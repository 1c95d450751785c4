// Compiled only into a ThreadSanitizer build (`make sanitize SANITIZER=thread`); empty otherwise.
//
// Swift's `Synchronization.Mutex` on Linux locks with an atomic compare-exchange inlined into
// the caller (instrumented: ThreadSanitizer sees it) and, when the lock is contended, with
// `_MutexHandle._lockSlow` / `_unlockSlow`, which live in libswiftSynchronization.so. That
// library is not instrumented: a lock taken there (a spin's compare-exchange, or the kernel's
// FUTEX_LOCK_PI) and an unlock done there (FUTEX_UNLOCK_PI) are invisible, so ThreadSanitizer
// reports every access made under a Mutex that was handed over while contended as a race
// (LogSink's buffers, between a worker and the log writer, were the first).
//
// These two definitions take the slow paths' place in the executable, call the library's own,
// and tell ThreadSanitizer what happened, on the handle's address (the address the inlined
// fast path's atomics use): an acquire once the slow lock returns, a release before the slow
// unlock. Nothing is suppressed; a real race on data outside its lock is still reported.
//
// Calling convention (x86_64, checked against the library's code): `borrowing func
// _lockSlow(_ selfId: UInt32)` takes selfId as its first argument and the handle's address in
// the swiftself register (clang's `swift_context` in a `swiftcall` function); `_unlockSlow()`
// takes only the handle.
#include <stdint.h>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#include <dlfcn.h>
#include <stdatomic.h>

void __tsan_acquire(void *addr);
void __tsan_release(void *addr);

#define LOCK_SLOW "$s15Synchronization12_MutexHandleV9_lockSlowyys6UInt32VF"
#define UNLOCK_SLOW "$s15Synchronization12_MutexHandleV11_unlockSlowyyF"

typedef void (*lock_slow_fn)(uint32_t, void *__attribute__((swift_context))) __attribute__((swiftcall));
typedef void (*unlock_slow_fn)(void *__attribute__((swift_context))) __attribute__((swiftcall));

static void *library_function(_Atomic(void *) *slot, const char *name) {
    void *f = atomic_load_explicit(slot, memory_order_acquire);
    if (!f) {
        f = dlsym(RTLD_NEXT, name);
        atomic_store_explicit(slot, f, memory_order_release);
    }
    return f;
}

__attribute__((swiftcall)) void sluice_tsan_lock_slow(uint32_t self_id, void *__attribute__((swift_context)) handle)
    __asm__(LOCK_SLOW);
__attribute__((swiftcall)) void sluice_tsan_lock_slow(uint32_t self_id, void *__attribute__((swift_context)) handle) {
    static _Atomic(void *) real;
    ((lock_slow_fn)library_function(&real, LOCK_SLOW))(self_id, handle);
    __tsan_acquire(handle);
}

__attribute__((swiftcall)) void sluice_tsan_unlock_slow(void *__attribute__((swift_context)) handle) __asm__(UNLOCK_SLOW);
__attribute__((swiftcall)) void sluice_tsan_unlock_slow(void *__attribute__((swift_context)) handle) {
    static _Atomic(void *) real;
    __tsan_release(handle);
    ((unlock_slow_fn)library_function(&real, UNLOCK_SLOW))(handle);
}
#endif
#endif

#if canImport(Glibc)
    import Glibc
#endif

/// Answers collected from every worker for one admin request: each worker `deliver`s once on
/// its own thread; the admin thread `wait`s until all have, or the time runs out (a stuck
/// worker must not hang the admin API; the answer then says how many replied).
///
/// Threading: `deliver` from any thread, `wait` from one. Lifetime: the pthread mutex and
/// condition are allocated here and freed in `deinit`, after every worker has let go of the
/// gather (each holds a strong reference until it delivered).
final class AdminGather<T: Sendable>: @unchecked Sendable {
    // @unchecked: `results` and `pending` are read and written only under `mutex`.
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let condition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    private var results: [T] = []
    private var pending: Int

    init(expected: Int) {
        pending = expected
        pthread_mutex_init(mutex, nil)
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(condition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    deinit {
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        condition.deallocate()
        mutex.deallocate()
    }

    func deliver(_ value: T) {
        pthread_mutex_lock(mutex)
        results.append(value)
        pending -= 1
        if pending == 0 { pthread_cond_signal(condition) }
        pthread_mutex_unlock(mutex)
    }

    /// Every answer delivered within `milliseconds`, and whether all workers answered.
    func wait(milliseconds: Int) -> (results: [T], complete: Bool) {
        var deadline = timespec()
        clock_gettime(CLOCK_MONOTONIC, &deadline)
        let nanos = deadline.tv_nsec + (milliseconds % 1000) * 1_000_000
        deadline.tv_sec += milliseconds / 1000 + nanos / 1_000_000_000
        deadline.tv_nsec = nanos % 1_000_000_000
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        while pending > 0 {
            if pthread_cond_timedwait(condition, mutex, &deadline) == ETIMEDOUT { break }
        }
        return (results, pending == 0)
    }
}

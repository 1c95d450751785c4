/// When a worker hands the heap memory a burst freed back to the kernel (`malloc_trim`).
///
/// glibc keeps what it frees in its arenas: after a thousand clients connected at once and
/// asked one request each, the process's RSS stays at the burst's peak although less than
/// half of it is still in use (measured: 11.6 MB of arena, 5.0 MB in use). `malloc_trim(0)`
/// returns the free whole pages inside every arena (`MADV_DONTNEED`), and the RSS falls back
/// to what is live. haproxy does the same from its pool garbage collector.
///
/// The call walks every arena under its lock, so a busy worker never makes it: activity
/// (a client accepted, a request started) arms a check `quietMilliseconds` later; a check
/// that finds new activity since the last one looks again one period later; the first check
/// that finds none trims, once, and nothing is armed again until the next activity. Under
/// steady load that is one timer every `quietMilliseconds` and no trim; an idle worker has
/// no timer at all.
///
/// A value type, events in and actions out: the worker owns the timer and makes the call.
/// Threading: one per worker, on its thread.
struct HeapTrimSchedule {
    /// How long a worker must have started nothing before it trims.
    static let quietMilliseconds = 250

    enum Action: Equatable {
        /// Nothing to do.
        case none
        /// Arm the check timer (`quietMilliseconds`).
        case arm
        /// Call `malloc_trim(0)`; the timer stays off.
        case trim
    }

    /// Whether the check timer is armed.
    private(set) var armed = false
    /// Activity since the last check.
    private var active = false

    /// A client was accepted or a request started.
    mutating func activity() -> Action {
        active = true
        guard !armed else { return .none }
        armed = true
        return .arm
    }

    /// The check timer fired.
    mutating func check() -> Action {
        guard armed else { return .none }
        if active {
            active = false
            return .arm
        }
        armed = false
        return .trim
    }
}

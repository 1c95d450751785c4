import CLibEvent
import CShims
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// An event on a worker's loop, with one owner discipline for the three kinds Sluice uses:
/// `LoopTimer` (a deadline, once or repeating), `LoopWake` (work handed to the loop, from its
/// own thread or another) and `SocketEvent` (a descriptor ready to read or write). Nothing
/// else in Sluice calls `event_new` or `event_free`.
///
/// - **Owned by one object, and freed with it.** Each event is made for its `owner`, which
///   holds it; `deinit` frees the libevent event, so an event that is dropped never fires.
/// - **It calls its owner, unretained.** The event keeps its owner `unowned(unsafe)` and
///   hands it to its closure (`{ $0.timerFired() }`): the owner holds the event and the event
///   dies with it, so the owner is alive whenever the closure runs, and there is no cycle.
///   The owner is retained for the closure's call, and the closure may drop the event (or the
///   owner its last reference) from within: nothing of the event is used after the call.
/// - **The closure captures nothing**: what it needs is its owner's (a small owner object
///   when there is more, as `Fleet`'s token polls). The event is not retained for the call
///   (that would cost every socket read a retain), so a capture could be freed under a
///   closure that drops its own event.
/// - **Freed before its loop.** An event must not outlive its `event_base` (freeing it
///   removes it from the base): an owner that may outlive its worker's loop drops its events in its
///   close path, not only in its `deinit`.
///
/// A per-request object may own events: one event costs one allocation more than libevent's
/// own, and a call through it about what a C callback with an `Unmanaged` pointer costs.
///
/// Threading: made, armed, stopped, fired and freed on the thread that runs its loop. The one
/// call another thread may make is `LoopWake.Handle.activate()`.
class LoopEvent {
    fileprivate var event: OpaquePointer!

    fileprivate init(base: OpaquePointer, fd: Int32, flags: Int32) {
        event = event_new(
            base, fd, Int16(flags),
            { _, what, arg in
                // Not retained: `fire` uses nothing of the event after the owner's closure
                // starts, which may drop it.
                LoopClock.open()
                Unmanaged<LoopEvent>.fromOpaque(arg!)._withUnsafeGuaranteedRef {
                    $0.fire(timedOut: what & Int16(EV_TIMEOUT) != 0)
                }
                LoopClock.close()
            }, Unmanaged.passUnretained(self).toOpaque())
    }

    deinit { event_free(event) }

    /// Calls the owner's closure (each kind overrides it).
    fileprivate func fire(timedOut: Bool) {}

    /// Disarms it: nothing fires until it is armed or activated again (an activation not yet
    /// run is withdrawn too).
    func stop() { event_del(event) }

    /// Runs its closure in this loop pass, after the callback running now, without a trip
    /// through `epoll_wait`; a deadline it was armed with stays.
    final func activate() { event_active(event, Int32(EV_READ), 0) }

    /// When libevent will run it, on libevent's clock; nil when it is not pending (tests).
    final var pendingTimeout: timeval? {
        var tv = timeval()
        return event_pending(event, Int16(EV_TIMEOUT), &tv) != 0 ? tv : nil
    }

    fileprivate final func add(microseconds: Int?) {
        guard let microseconds else {
            event_add(event, nil)
            return
        }
        var tv = timeval(tv_sec: microseconds / 1_000_000, tv_usec: microseconds % 1_000_000)
        event_add(event, &tv)
    }
}

/// A timer on a worker's loop: `arm` it for a delay, `stop` it, arm it again; `fired` runs on
/// the loop when the delay ends — once, or every delay until stopped when `repeating`.
/// Re-arming moves the deadline.
///
/// A `lazy` timer (one-shot only) is for deadlines armed and stopped on every request — a
/// connection's idle and header timers, a pooled connection's idle time, a try's wait for
/// its response head — which almost never fire. It keeps the deadline in a field and leaves
/// libevent's event where it was: `stop` only forgets the deadline, and `arm` calls
/// `event_add` only when the event is not pending or would fire after the new deadline.
/// When the event fires early (a deadline moved later, or a stopped one), the timer adds it
/// again for what is left, or does nothing. A request costs a clock read instead of an
/// `event_add` and an `event_del` (each ~250 instructions with the base's lock), and the
/// deadline still holds to the microsecond: `fired` never runs before it, and not after
/// libevent would have run it. The delay counts from the callback's `LoopClock` reading
/// (its first read of the clock, or a script's end), not from a read of its own: the four
/// timers a request arms share one `clock_gettime`. What it costs: a stopped timer still
/// wakes the loop once, at the deadline it was last added for, and keeps an
/// `event_base_dispatch` without an explicit exit from returning until then — no lazy
/// timer lives where that matters.
/// Its `activate()` does not bring the deadline forward.
///
/// Threading and ownership: `LoopEvent`'s.
final class LoopTimer<Owner: AnyObject>: LoopEvent {
    private unowned(unsafe) let owner: Owner
    private let fired: (Owner) -> Void
    private let lazy: Bool
    /// Lazy timers: the deadline `fired` waits for, in monotonic microseconds; `.max` when
    /// stopped.
    private var deadline: Int64 = .max
    /// Lazy timers: when libevent's event is due (no later than this); `.max` when it is not
    /// pending.
    private var pendingUntil: Int64 = .max

    init(
        on base: OpaquePointer, owner: Owner, repeating: Bool = false, lazy: Bool = false,
        _ fired: @escaping (Owner) -> Void
    ) {
        precondition(!(repeating && lazy), "a lazy timer fires once")
        self.owner = owner
        self.fired = fired
        self.lazy = lazy
        super.init(base: base, fd: -1, flags: repeating ? EV_PERSIST : 0)
    }

    override fileprivate func fire(timedOut: Bool) {
        guard lazy else { return fired(owner) }
        pendingUntil = .max
        guard deadline != .max else { return }  // stopped since it was added
        let now = LoopClock.microseconds()
        if now < deadline {
            // Moved later since it was added: wait for the rest.
            add(microseconds: Int(deadline - now))
            pendingUntil = deadline
            return
        }
        deadline = .max
        fired(owner)
    }

    /// Fires after `milliseconds` (and every `milliseconds` after that when repeating).
    func arm(milliseconds: Int) { arm(microseconds: milliseconds * 1000) }

    func arm(microseconds: Int) {
        guard lazy else { return add(microseconds: microseconds) }
        let due = LoopClock.microseconds() + Int64(microseconds)
        deadline = due
        // The event fires no later than `pendingUntil`, and `fire` waits for the rest.
        if pendingUntil <= due { return }
        add(microseconds: microseconds)
        pendingUntil = due
    }

    override func stop() {
        guard lazy else { return super.stop() }
        deadline = .max
    }

    /// Whether it is armed and has not fired (lazy timers only).
    var isArmed: Bool { deadline != .max }
}

/// Work handed to a worker's loop: `activate()` makes `woken` run there in the loop's next
/// pass (activations before it runs are one). On the loop's own thread it runs after the
/// callback that asked, never inside it; another thread asks through `handle`, which only a
/// wake made `crossThread` has.
///
/// A worker's loop takes no lock (`LoopBase.make()`), so another thread never calls
/// libevent on it: a cross-thread wake owns an eventfd, which its `Handle` writes and its
/// persistent read event drains before `woken` runs (writes before that are one).
///
/// Threading and ownership: `LoopEvent`'s, with one exception: `Handle.activate()` may be
/// called from any thread (a `write(2)` to the eventfd), and is the only call that crosses
/// threads.
final class LoopWake<Owner: AnyObject>: LoopEvent {
    private unowned(unsafe) let owner: Owner
    private let woken: (Owner) -> Void
    /// The eventfd other threads write (`crossThread`); -1 for a wake of the loop's own thread.
    private let wakeFD: Int32

    init(on base: OpaquePointer, owner: Owner, crossThread: Bool = false, _ woken: @escaping (Owner) -> Void) {
        self.owner = owner
        self.woken = woken
        if crossThread {
            let fd = sluice_wake_fd()
            // Without one the process cannot take signals or reloads: nothing to go on with.
            precondition(fd >= 0, "eventfd failed: errno \(errno)")
            wakeFD = fd
            super.init(base: base, fd: fd, flags: EV_READ | EV_PERSIST)
            add(microseconds: nil)
        } else {
            wakeFD = -1
            super.init(base: base, fd: -1, flags: 0)
        }
    }

    deinit {
        guard wakeFD >= 0 else { return }
        // Out of the loop's set before the descriptor goes (`LoopEvent`'s deinit frees it).
        stop()
        close(wakeFD)
    }

    override fileprivate func fire(timedOut: Bool) {
        if wakeFD >= 0 {
            var count: UInt64 = 0
            _ = read(wakeFD, &count, 8)  // EAGAIN when activated on the loop's own thread
        }
        woken(owner)
    }

    /// What another thread holds to wake the loop (a `crossThread` wake's only).
    var handle: Handle {
        precondition(wakeFD >= 0, "a LoopWake activated from another thread must be made crossThread")
        return Handle(fd: wakeFD)
    }

    /// A `LoopWake` as other threads see it. It does not keep the wake alive: whoever
    /// activates it must know the wake (and so its descriptor) still exists, as a worker's
    /// `Mailbox` does (it is locked around every activation and closed before the worker
    /// drops its events).
    struct Handle: Sendable {
        fileprivate let fd: Int32

        func activate() {
            var one: UInt64 = 1
            // EAGAIN only when the counter is near 2^64: the loop has a wake pending anyway.
            _ = write(fd, &one, 8)
        }
    }
}

/// The event loops Sluice makes.
enum LoopBase {
    /// A loop without libevent's lock: libevent is called on it from its own thread only
    /// (other threads wake it through a `crossThread` `LoopWake`). The lock cost every
    /// `event_add`, `event_del`, activation and callback a mutex acquire and release (six
    /// pairs a forwarded request, some 540 instructions and 12 atomic operations).
    static func make() -> OpaquePointer? {
        guard let config = event_config_new() else { return nil }
        defer { event_config_free(config) }
        event_config_set_flag(config, Int32(EVENT_BASE_FLAG_NOLOCK.rawValue))
        return event_base_new_with_config(config)
    }
}

/// A descriptor's readiness on a worker's loop: once `arm`ed, `ready` runs when `fd` can be
/// read (`.read`) or written (`.write`) — every time it can until stopped when `persistent`,
/// else once per `arm`. With a timeout, `ready` is told `timedOut` if the descriptor was not
/// ready in time. The descriptor is the owner's: the event never closes it, and is dropped
/// (or stopped) before the owner closes it.
///
/// Threading and ownership: `LoopEvent`'s.
final class SocketEvent<Owner: AnyObject>: LoopEvent {
    private unowned(unsafe) let owner: Owner
    private let ready: (Owner, _ timedOut: Bool) -> Void

    init(
        on base: OpaquePointer, fd: Int32, _ direction: SocketDirection, persistent: Bool = true, owner: Owner,
        _ ready: @escaping (Owner, _ timedOut: Bool) -> Void
    ) {
        self.owner = owner
        self.ready = ready
        let flags = (direction == .read ? EV_READ : EV_WRITE) | (persistent ? EV_PERSIST : 0)
        super.init(base: base, fd: fd, flags: flags)
    }

    override fileprivate func fire(timedOut: Bool) {
        ready(owner, timedOut)
    }

    /// Waits for the descriptor (at most `timeoutMilliseconds`, when given).
    func arm(timeoutMilliseconds: Int? = nil) { add(microseconds: timeoutMilliseconds.map { $0 * 1000 }) }
}

/// What a `SocketEvent` waits for.
enum SocketDirection {
    case read
    case write
}

import CLibEvent

#if canImport(Glibc)
    import Glibc
#endif

/// A one-shot timer on a worker's event loop: `arm` it for a delay, `stop` it, arm it again;
/// `fired` runs on the loop when it ends. Freed with its owner (`deinit` frees the event, so a
/// timer that is dropped never fires), which makes it safe to drop from within `fired` too.
///
/// `fired` should capture its owner `unowned(unsafe)`: the owner holds the timer, and the
/// timer dies with it.
///
/// Threading: made, armed, stopped and fired on one worker's thread.
final class LoopTimer {
    private let event: OpaquePointer
    private let fired: () -> Void

    init(on base: OpaquePointer, _ fired: @escaping () -> Void) {
        self.fired = fired
        // The event's argument is filled in below, once `self` exists.
        event = event_new(base, -1, 0, nil, nil)!
        event_assign(
            event, base, -1, 0,
            { _, _, arg in
                // Alive through `fired`, which may drop the owner's last reference to it.
                let timer = Unmanaged<LoopTimer>.fromOpaque(arg!).takeUnretainedValue()
                withExtendedLifetime(timer) { timer.fired() }
            },
            Unmanaged.passUnretained(self).toOpaque())
    }

    deinit { event_free(event) }

    /// Fires after `milliseconds` (re-arming moves the deadline).
    func arm(milliseconds: Int) {
        var tv = timeval(tv_sec: milliseconds / 1000, tv_usec: (milliseconds % 1000) * 1000)
        event_add(event, &tv)
    }

    func stop() { event_del(event) }
}

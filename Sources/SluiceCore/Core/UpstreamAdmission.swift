/// How many forwarded requests one worker has upstream at once (`limits.max_in_flight_upstream`),
/// and what happens to the rest: they wait in a FIFO queue of at most `limits.upstream_queue`
/// entries for at most `timeouts.upstream_queue`, and are refused (`503` with `Retry-After`,
/// `ProxyError.upstreamQueueFull` / `.upstreamQueueTimeout`) when the queue is full or their
/// wait runs out. A request that leaves while it waits (its client disconnected) leaves the
/// queue.
///
/// A value type: events in, actions out, the time passed in with every event (milliseconds
/// on a monotonic clock), so every rule is unit-tested without sockets
/// (`Tests/SluiceCoreTests/UpstreamAdmissionTests.swift`). The worker performs the actions:
/// it starts the requests named in `start`, answers those in `refuse`, and arms or cancels
/// its one queue timer as `timer` says. Requests are named by a ticket the worker chooses
/// (unique among those the admission knows).
///
/// The hot path (a slot is free, nobody waits) allocates nothing: the action lists stay empty
/// (`admitted` says the arriving request goes).
///
/// Threading: one per worker, a stored property of its `Worker`, touched only on that
/// worker's thread. Nothing is shared between workers: each has its own slots and queue.
public struct UpstreamAdmission: Sendable {
    public struct Settings: Sendable, Equatable {
        /// Requests upstream at once; nil means unlimited (nothing ever waits).
        public var maxInFlight: Int?
        /// Requests that may wait; 0 refuses at once when every slot is taken.
        public var queueSize: Int
        /// How long a request may wait, in milliseconds.
        public var queueTimeout: Int

        public init(maxInFlight: Int?, queueSize: Int, queueTimeout: Int) {
            self.maxInFlight = maxInFlight
            self.queueSize = queueSize
            self.queueTimeout = queueTimeout
        }
    }

    public enum Refusal: Sendable, Equatable {
        /// `queueSize` requests were waiting already.
        case queueFull
        /// No slot became free within `queueTimeout`.
        case queueTimeout
    }

    public enum Event: Sendable, Equatable {
        /// A request wants to go upstream.
        case arrive(UInt64)
        /// A request that was started has ended (answered, failed or abandoned).
        case release
        /// A waiting request's client went away.
        case leave(UInt64)
        /// The queue timer fired.
        case timer
        /// New settings (a reload).
        case reconfigure(Settings)
    }

    /// What the worker's queue timer should do.
    public enum Timer: Sendable, Equatable {
        case keep
        /// (Re)arm it to fire at this monotonic time (ms).
        case arm(at: Int)
        case cancel
    }

    public struct Refused: Sendable, Equatable {
        public let ticket: UInt64
        public let reason: Refusal
    }

    public struct Actions: Sendable, Equatable {
        /// The arriving request goes upstream at once (it holds a slot until `.release`).
        public var admitted = false
        /// Waiting requests that may go upstream now (each holds a slot until `.release`).
        public var start: [UInt64] = []
        /// Requests to answer with a 503 (they hold no slot and are no longer queued).
        public var refuse: [Refused] = []
        /// The arriving request waits in the queue.
        public var queued = false
        public var timer: Timer = .keep
    }

    private struct Waiting: Sendable {
        let ticket: UInt64
        let deadline: Int
    }

    public private(set) var settings: Settings
    /// Requests started and not yet released.
    public private(set) var inFlight = 0
    /// The queue, oldest first, from `head` on (the array is compacted as it drains).
    private var waiting: [Waiting] = []
    private var head = 0
    /// The deadline the worker's timer is armed for, if it is.
    private var armed: Int?

    public init(_ settings: Settings) {
        self.settings = settings
    }

    /// Requests waiting now.
    public var queued: Int { waiting.count - head }

    private var slotFree: Bool {
        guard let max = settings.maxInFlight else { return true }
        return inFlight < max
    }

    /// `.arrive` when nothing waits and a slot is free: the request takes it (true), with
    /// nothing else to do — no clock, no actions (every request asks; false: ask `handle`).
    public mutating func admitAtOnce() -> Bool {
        guard queued == 0 && slotFree else { return false }
        inFlight += 1
        return true
    }

    /// `.release` when nothing waits: the slot is given back (true), with nothing else to do.
    public mutating func releaseAtOnce() -> Bool {
        guard queued == 0 else { return false }
        if inFlight > 0 { inFlight -= 1 }
        return true
    }

    public mutating func handle(_ event: Event, now: Int) -> Actions {
        var actions = Actions()
        switch event {
        case .arrive(let ticket):
            if admitAtOnce() {
                actions.admitted = true
                return actions  // nothing waits: the timer is untouched, nothing is allocated
            }
            if queued >= settings.queueSize {
                actions.refuse.append(Refused(ticket: ticket, reason: .queueFull))
                return actions
            }
            waiting.append(Waiting(ticket: ticket, deadline: now + settings.queueTimeout))
            actions.queued = true
            fill(now: now, into: &actions)
        case .release:
            if releaseAtOnce() { return actions }
            if inFlight > 0 { inFlight -= 1 }
            fill(now: now, into: &actions)
        case .leave(let ticket):
            if let i = waiting[head...].firstIndex(where: { $0.ticket == ticket }) {
                waiting.remove(at: i)
            }
        case .timer:
            armed = nil
            expire(now: now, into: &actions)
            fill(now: now, into: &actions)
        case .reconfigure(let new):
            settings = new
            fill(now: now, into: &actions)
        }
        actions.timer = retime()
        compact()
        return actions
    }

    /// Starts waiting requests while slots are free (the oldest first); one whose wait has
    /// run out is refused instead (its timer may not have fired yet in this loop pass).
    private mutating func fill(now: Int, into actions: inout Actions) {
        while queued > 0 && slotFree {
            let next = waiting[head]
            head += 1
            if next.deadline <= now {
                actions.refuse.append(Refused(ticket: next.ticket, reason: .queueTimeout))
            } else {
                inFlight += 1
                actions.start.append(next.ticket)
            }
        }
    }

    /// Refuses every waiting request whose deadline has passed (any position: a reload may
    /// have shortened the timeout for later arrivals).
    private mutating func expire(now: Int, into actions: inout Actions) {
        var kept: [Waiting] = []
        kept.reserveCapacity(queued)
        for w in waiting[head...] {
            if w.deadline <= now {
                actions.refuse.append(Refused(ticket: w.ticket, reason: .queueTimeout))
            } else {
                kept.append(w)
            }
        }
        waiting = kept
        head = 0
    }

    /// The timer command that makes the worker's timer fire at the earliest deadline.
    private mutating func retime() -> Timer {
        let earliest = waiting[head...].lazy.map(\.deadline).min()
        guard earliest != armed else { return .keep }
        armed = earliest
        if let earliest { return .arm(at: earliest) }
        return .cancel
    }

    private mutating func compact() {
        if head == waiting.count {
            waiting.removeAll(keepingCapacity: waiting.count <= 64)
            head = 0
        } else if head > 64 && head * 2 > waiting.count {
            waiting.removeFirst(head)
            head = 0
        }
    }
}

/// How many connections a worker takes from one listener before it turns to other work.
///
/// libevent's listener accepts until the kernel's queue is empty. A thousand clients that
/// connected at once were all accepted in one pass of the loop, their requests read in the
/// next, and each request opened an origin connection of its own before the first response
/// came back: the pool was left holding about as many idle origin connections as there had
/// been clients (≈ 940 for 1,000 clients on 2 workers), each with its socket, buffers and
/// idle timer, and the heap pages the burst's transfers left among them (+6.7 MiB of RSS
/// against haproxy's +2.1 for the same clients). Taking at most `limit` per listener per
/// pass lets the first requests' responses come back, and their origin connections go back
/// to the pool to be reused, while the rest wait in the kernel's listen queue (the client's
/// connection is already established there). haproxy does the same (`tune.maxaccept`, 4 by
/// default, "which showed best results").
///
/// A value type, events in and actions out: the worker switches the listener off when a
/// batch is full and on again when the pass ends (a `LoopWake`, run in the same pass).
/// Threading: one per listener, on its worker's thread.
struct AcceptBatch {
    /// Connections accepted from one listener per pass of the loop at most (4, haproxy's
    /// default).
    static let limit = 4

    private var count = 0

    /// What the worker does after one accept.
    struct Action: Equatable {
        /// The first of this pass: the worker asks to be told when the pass ends.
        let watchPassEnd: Bool
        /// The batch is full: the listener is switched off until the pass ends.
        let pause: Bool
    }

    /// A connection was accepted from the listener.
    mutating func accepted() -> Action {
        count += 1
        return Action(watchPassEnd: count == 1, pause: count == Self.limit)
    }

    /// The pass ended: the next one starts a new batch. True when the batch had paused the
    /// listener (the worker switches it on again).
    mutating func passEnded() -> Bool {
        defer { count = 0 }
        return count >= Self.limit
    }
}

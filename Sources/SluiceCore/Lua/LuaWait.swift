import CLua

/// Something a waiting hook call waits on: a sub-request (`sluice.http`), the call's
/// wall-clock timer, later a Redis command of `sluice.shared`. Its completion runs on the
/// worker's thread; after `cancel()` it never runs (and the operation drops it, with whatever
/// it captured).
public protocol LuaOperation: AnyObject {
    func cancel()
}

/// What a worker lends the hook calls that may wait (a `lua` entry with `allow_hosts`): its
/// loop's timers and its sub-requests. `SessionContext.lua` gives it to `LuaAdapter`.
///
/// Threading: the worker's thread. A completion may even run inside the call that started
/// its operation (a sub-request refused before it is sent): `LuaWait` holds such an answer
/// until the coroutine has yielded.
public protocol LuaHost: AnyObject {
    /// Sends `request` through this Sluice's own pipeline (the target host's policy).
    func subrequest(
        _ request: LuaSubrequest, completion: @escaping (Result<LuaSubresponse, LuaOperationError>) -> Void
    ) -> any LuaOperation
    /// Calls `fired` once, `microseconds` from now (at once when not positive).
    func timer(microseconds: Int64, _ fired: @escaping () -> Void) -> any LuaOperation
    /// Why a script may never call `host:port` whatever its `allow_hosts` says (this Sluice's
    /// admin listener), or nil.
    func refusal(host: String, port: Int) -> String?
    /// The fleet's shared table (`fleet:`), when there is one: `sluice.shared` then waits for
    /// it. nil: the process's table (`LuaSharedMemory.process`).
    var shared: (any LuaSharedStore)? { get }
}

extension LuaHost {
    public var shared: (any LuaSharedStore)? { nil }
}

/// Why an operation failed, as the script reads it (`nil, message`).
public struct LuaOperationError: Error, Sendable, Equatable {
    public var message: String
    public init(_ message: String) { self.message = message }
}

/// One hook call that may wait, from its start to its end: the pending-operation mechanism
/// every waiting function of the `sluice` module shares. A function starts its operation with
/// `suspend`, which returns `SLUICE_LUA_YIELD` (the CLua trampoline then yields the call's
/// coroutine); when the operation completes, its results are pushed onto the coroutine and the
/// call resumes under the budgets it had left. The wall-clock budget (`limits.wall`) covers the
/// whole call, waits included: one timer on the worker's loop, armed at the first wait; when
/// it fires the operation is cancelled, the coroutine dropped (the state stays usable: no Lua
/// code was interrupted) and the call fails with the `wall` limit; a late completion is
/// ignored.
///
/// An answer that comes at once (Redis down, a refused sub-request) is held until the
/// coroutine yielded, and then resumes it from a loop, not from inside the call that yielded:
/// a script that waits in a loop would otherwise recurse without bound. Each wait is charged
/// one period of the instruction budget and reads the clock, so such a loop, which never
/// reaches the count hook (it is set again at each resume) nor lets the wall-clock timer fire
/// (a loop event), stops at the instruction or the wall-clock budget all the same.
///
/// A client that leaves, or an exchange dropped, while the call waits does not end it: the
/// call runs to its end or to its wall-clock limit, whichever is first, and its answer goes to
/// an exchange that no longer listens. Nothing outlives that bound.
///
/// Threading: its state's thread (the worker's).
final class LuaWait {
    enum Phase {
        /// The coroutine runs (or has not yet waited).
        case running
        /// A function started an operation and is yielding: an answer now is held.
        case starting
        /// The coroutine is suspended until the operation answers or the timer fires.
        case waiting
        /// The call ended; nothing more is done.
        case done
    }

    /// Pushes an operation's results onto the coroutine and returns how many.
    typealias Results = (OpaquePointer) -> Int32

    unowned let state: LuaState
    let host: any LuaHost
    let allowHosts: [LuaAllowedHost]
    /// The exchange's sub-request depth (0 for a client's request).
    let depth: Int
    /// `sluice.http` calls made so far in this call (`limits.subrequests`).
    var subrequests = 0
    private(set) var phase = Phase.running
    private var operation: (any LuaOperation)?
    private var held: Results?
    private var timer: (any LuaOperation)?
    // The meter while the call waits (other calls run on the state meanwhile).
    private var periods: Int64 = 0
    private var periodLimit: Int64 = 0
    private var deadline: Int64 = 0
    private var peak = 0
    private var external = 0
    private var collections: Int32 = 0
    /// When the call began, on the state's clock.
    var started: Int64 = 0
    /// `deliver` is resuming the coroutine: an answer held by a wait inside that run is left in
    /// `next` for its loop.
    private var delivering = false
    private var next: Results?
    /// Resumes the coroutine with results (the exchange's), and ends the call.
    var resume: ((Results) -> Void)?
    var end: ((LuaCallResult) -> Void)?

    init(state: LuaState, host: any LuaHost, allowHosts: [LuaAllowedHost], depth: Int) {
        self.state = state
        self.host = host
        self.allowHosts = allowHosts
        self.depth = depth
    }

    /// Whether a yield now is this wait's (`LuaState.resume`).
    var isSuspending: Bool { phase == .starting }

    /// For a `sluice` function: starts the operation `start` makes (handing it the function
    /// that delivers its results) and returns what the function returns to yield. The
    /// function has checked `lua_isyieldable` first.
    func suspend(_ start: (@escaping (@escaping Results) -> Void) -> any LuaOperation) -> Int32 {
        phase = .starting
        operation = start { [self] results in answered(results) }
        return SLUICE_LUA_YIELD
    }

    /// After a run of the coroutine returned: it yielded for an operation (`yielded`), or the
    /// call ended with `result`.
    func settle(_ result: LuaCallResult, yielded: Bool) {
        guard yielded, phase == .starting else { return finish(result) }
        phase = .waiting
        let meter = state.meter
        // One period for the wait: a loop of waits answered at once never reaches the hook.
        periods = meter.pointee.periods + 1
        periodLimit = meter.pointee.period_limit
        deadline = meter.pointee.deadline_us
        peak = meter.pointee.peak
        external = meter.pointee.external
        collections = meter.pointee.collections
        if timer == nil {
            timer = host.timer(microseconds: deadline - state.now) { [self] in expired() }
        }
        if let results = held {
            held = nil
            deliver(results)
        }
    }

    /// Puts the waiting call's budgets back into the meter before it resumes.
    func restore() {
        let meter = state.meter
        meter.pointee.stopped = Int32(SLUICE_LUA_RUNNING)
        meter.pointee.refused = 0
        meter.pointee.periods = periods
        meter.pointee.period_limit = periodLimit
        meter.pointee.deadline_us = deadline
        meter.pointee.peak = max(peak, meter.pointee.used)
        meter.pointee.external = external
        meter.pointee.collections = collections
    }

    private func answered(_ results: @escaping Results) {
        switch phase {
        case .starting: held = results
        case .waiting: deliver(results)
        case .running, .done: break  // late: the call ended (its wall limit) or moved on
        }
    }

    /// Resumes the waiting coroutine with `results`, and again with each answer a wait in that
    /// run got at once (`next`), in a loop; stops the call at its budgets first.
    private func deliver(_ results: @escaping Results) {
        if delivering {
            next = results
            return
        }
        delivering = true
        defer { delivering = false }
        var current: Results? = results
        while let results = current, phase == .waiting {
            current = nil
            if periods >= periodLimit {
                return stopped(.instructions, "instruction limit reached while waiting (limits.instructions)")
            }
            if state.now >= deadline { return stopped(.wall, "wall-clock limit reached while waiting (limits.wall)") }
            phase = .running
            operation = nil
            resume?(results)
            current = next
            next = nil
        }
    }

    private func expired() {
        timer = nil
        guard phase == .waiting else { return }
        stopped(.wall, "wall-clock limit reached while waiting (limits.wall)")
    }

    /// Ends the waiting call at a budget (the coroutine is dropped; no Lua code was interrupted).
    private func stopped(_ kind: LuaLimitKind, _ message: String) {
        var result = LuaCallResult()
        result.instructions = Int(periods) * Int(SLUICE_LUA_HOOK_PERIOD)
        result.peakMemory = peak
        result.microseconds = state.now - started
        result.outcome = .limit(kind, "\(state.script.name): \(message)")
        finish(result)
    }

    private func finish(_ result: LuaCallResult) {
        phase = .done
        operation?.cancel()
        operation = nil
        timer?.cancel()
        timer = nil
        held = nil
        next = nil
        resume = nil
        let end = end
        self.end = nil
        end?(result)
    }
}

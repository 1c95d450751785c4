import CLua

/// One exchange's use of a script: its `ctx` (made on first need, kept across the exchange's
/// hooks, so `on_request` can leave data for `on_response` and `on_log`), its policy's
/// `config` and `limits`, and its request id for the script's log lines. Each hook method runs
/// the script's hook as a coroutine of the state and returns what it did; a script without
/// that hook costs nothing (`LuaCallResult()`).
///
/// Edits reach the caller's view only when the call succeeds: a failed call leaves it as it
/// was, so `fail_open` carries on with the message the script never touched.
///
/// Threading: the state's thread (the exchange's worker). The exchange keeps its state alive.
/// A state poisoned by a limit (in this exchange's call or another's) takes no new exchange
/// (the cache hands the next one a fresh state), but an exchange that began in it — its `ctx`
/// is there — runs its later hooks in it, and a call waiting in it goes on to its end.
public final class LuaExchange {
    public let state: LuaState
    @exclusivity(unchecked) public private(set) var limits: LuaLimits
    @exclusivity(unchecked) public private(set) var requestID: UInt64
    let config: LuaConfig
    @exclusivity(unchecked) private var contextRef = LUA_NOREF

    init(state: LuaState, config: LuaConfig, limits: LuaLimits, requestID: UInt64) {
        self.state = state
        self.config = config
        self.limits = limits
        self.requestID = requestID
    }

    /// Makes the exchange another request's, for a call on the same state and config
    /// (`LuaStateCache.requestExchange`): only one that made no `ctx`, which holds nothing of
    /// its request.
    func reuse(limits: LuaLimits, requestID: UInt64) {
        assert(!hasContext, "an exchange with a ctx is its request's")
        self.limits = limits
        self.requestID = requestID
    }

    /// Whether a hook of the exchange was given `ctx` (made on the first that takes it).
    public var hasContext: Bool { contextRef != LUA_NOREF }

    deinit {
        if contextRef != LUA_NOREF { state.recycleContext(contextRef) }
    }

    /// `on_request(req, ctx)`: `request` gets the script's edits; `respond` what it answered.
    ///
    /// With `restoringOnFailure` (for `fail_open`), the script edits a copy and a failed call
    /// leaves `request` as it was; without it (`fail_closed`, which drops a failed request),
    /// the script edits `request` itself, lent to the slot by address (`LuaCallSlot.lending`).
    public func onRequest(_ request: inout LuaRequestView, restoringOnFailure: Bool = true) -> LuaCallResult {
        var result = LuaCallResult()
        onRequest(&request, restoringOnFailure: restoringOnFailure, into: &result)
        return result
    }

    /// `onRequest`, its result written into `result` (a fresh `LuaCallResult`): the per-request
    /// path's form. Returned, the result was copied out and destroyed (~110 instructions): the
    /// lending closure captures it, so it could not be moved.
    public func onRequest(_ request: inout LuaRequestView, restoringOnFailure: Bool, into result: inout LuaCallResult) {
        guard let hook = state.onRequestHook else { return }
        guard !state.isPoisoned || contextRef != LUA_NOREF else {
            result = Self.poisoned(state)
            return
        }
        let slot = state.acquireSlot()
        slot.begin(.request, limits: limits, requestID: requestID)
        if restoringOnFailure {
            slot.request = request
            call(hook, slot, message: slot.requestRef, into: &result)
            if result.succeeded { swap(&request, &slot.request) }
        } else {
            // The script edits `request` where it is (the call never waits here).
            slot.lending(&request) { call(hook, slot, message: slot.requestRef, into: &result) }
            slot.messageReturned = true
        }
        if result.succeeded, slot.respond != nil { result.respond = slot.respond }
        finish(slot)
    }

    /// `on_request(req, ctx)` for a call that may wait (`sluice.http`): `completion` gets the
    /// request with the script's edits (as it was when the call failed) and what the call did,
    /// at once when the script never waits, else later on this thread (`LuaWait`).
    public func onRequest(
        _ request: LuaRequestView, waitingWith host: any LuaHost, allowHosts: [LuaAllowedHost], depth: Int,
        completion: @escaping (LuaRequestView, LuaCallResult) -> Void
    ) {
        guard let hook = state.onRequestHook else { return completion(request, LuaCallResult()) }
        guard !state.isPoisoned || contextRef != LUA_NOREF else { return completion(request, Self.poisoned(state)) }
        let slot = state.acquireSlot()
        slot.begin(.request, limits: limits, requestID: requestID)
        slot.request = request
        let wait = LuaWait(state: state, host: host, allowHosts: allowHosts, depth: depth)
        slot.wait = wait
        wait.end = { [self] result in
            var result = result
            let edited = slot.request
            if result.succeeded { result.respond = slot.respond }
            finish(slot)
            completion(result.succeeded ? edited : request, result)
        }
        wait.resume = { [self] results in
            // Resumed even when another call's limit poisoned the state meanwhile: the stop
            // ended that call only (Lua unwinds it as an error, leaving the state whole), and
            // this one's coroutine was untouched. A poisoned state takes no new call; it goes
            // once the calls that were waiting in it end.
            let co = slot.thread!
            wait.restore()
            let count = results(co)
            wait.settle(run(slot, arguments: count, since: wait.started), yielded: slot.lastStatus == LUA_YIELD)
        }
        wait.started = state.now
        var result = LuaCallResult()
        call(hook, slot, message: slot.requestRef, into: &result)
        wait.settle(result, yielded: slot.lastStatus == LUA_YIELD)
    }

    /// `on_response(res, ctx)`: `response` gets the script's edits; `retry` whether it asked
    /// for another try. `restoringOnFailure` as for `onRequest`.
    public func onResponse(_ response: inout LuaResponseView, restoringOnFailure: Bool = true) -> LuaCallResult {
        guard let hook = state.onResponseHook else { return LuaCallResult() }
        // A poisoned state takes no new exchange (`LuaStateCache.state` builds another), but an
        // exchange that began in it (its `ctx` is there) runs its later hooks in it.
        guard !state.isPoisoned || contextRef != LUA_NOREF else { return Self.poisoned(state) }
        let slot = state.acquireSlot()
        slot.begin(.response, limits: limits, requestID: requestID)
        if restoringOnFailure { slot.response = response } else { swap(&slot.response, &response) }
        var result = LuaCallResult()
        call(hook, slot, message: slot.responseRef, into: &result)
        if result.succeeded || !restoringOnFailure {
            swap(&response, &slot.response)
            slot.messageReturned = !restoringOnFailure
        }
        if result.succeeded { result.retry = slot.retry }
        finish(slot)
        return result
    }

    /// `on_log(ctx)`, after the exchange; then read `vars()` for the access log.
    public func onLog() -> LuaCallResult {
        guard let hook = state.onLogHook else { return LuaCallResult() }
        guard !state.isPoisoned || contextRef != LUA_NOREF else { return Self.poisoned(state) }
        let slot = state.acquireSlot()
        slot.begin(.log, limits: limits, requestID: requestID)
        var result = LuaCallResult()
        call(hook, slot, message: nil, into: &result)
        finish(slot)
        return result
    }

    /// What `vars()` copies of `ctx.vars` at most, in bytes (`Lua.value`): an access-log line
    /// is no place for more, and a table that repeats one long string is small in the state
    /// but not as copies.
    static let varsBudget = 64 * 1024

    /// What the script put in `ctx.vars` (string keys; strings, numbers, booleans and tables of
    /// them), for the access log's `lua` field, at most `varsBudget` bytes of it (with
    /// `"truncated": true` when there was more). Empty when no hook took `ctx`.
    public func vars() -> [String: LuaValue] {
        // Read from a poisoned state too (a call that waited in it ended well): the walk only
        // reads tables, bounded by `varsBudget`.
        guard contextRef != LUA_NOREF else { return [:] }
        let L = state.L
        lua_rawgeti(L, Lua.registry, lua_Integer(contextRef))
        Lua.push(L, "vars")
        lua_rawget(L, -2)
        defer { sluice_lua_pop(L, 2) }
        // Most scripts leave `vars` empty: no value is read for those.
        guard lua_type(L, -1) == LUA_TTABLE else { return [:] }
        lua_pushnil(L)
        guard lua_next(L, -2) != 0 else { return [:] }
        sluice_lua_pop(L, 2)
        var budget = Self.varsBudget
        if case .table(var fields) = Lua.value(L, -1, budget: &budget) {
            if budget < 0 { fields["truncated"] = .bool(true) }
            return fields
        }
        return [:]
    }

    /// Runs `hook` on `slot`'s coroutine with its message (and `ctx` if it takes one), its
    /// outcome and costs put in `result` (a fresh one: every copy of a result cost some 100
    /// instructions).
    private func call(_ hook: LuaState.Hook, _ slot: LuaCallSlot, message: Int32?, into result: inout LuaCallResult) {
        let co = slot.thread!
        lua_rawgeti(co, Lua.registry, lua_Integer(hook.ref))
        var arguments: Int32 = 0
        if let message {
            lua_rawgeti(co, Lua.registry, lua_Integer(message))
            arguments += 1
        }
        if hook.takesContext {
            pushContext(co)
            arguments += 1
        }
        running(slot, &result) { state.run(co, arguments: arguments, limits: limits, into: &$0) }
    }

    /// Resumes a waiting call's coroutine with the `arguments` results on its stack.
    private func run(_ slot: LuaCallSlot, arguments: Int32, since start: Int64) -> LuaCallResult {
        var result = LuaCallResult()
        running(slot, &result) { state.resume(slot.thread!, arguments: arguments, since: start, into: &$0) }
        return result
    }

    /// Runs `slot`'s coroutine by `body` (`LuaState.run` or `.resume`, filling `result` and
    /// returning `lua_resume`'s status) as the state's current call.
    @inline(__always)
    private func running(_ slot: LuaCallSlot, _ result: inout LuaCallResult, _ body: (inout LuaCallResult) -> Int32) {
        // The previous value comes back after (nil but for a call run inside another's, which
        // nothing does today): a message answers only in the running call.
        let outer = state.current
        state.current = slot
        let status = body(&result)
        state.current = outer
        if slot.bodyRefused, case .error(let message) = result.outcome { result.outcome = .limit(.body, message) }
        slot.lastStatus = status
    }

    /// Ends the call on `slot` (the caller keeps its result: passed through here, it was
    /// copied, some 400 instructions a call).
    private func finish(_ slot: LuaCallSlot) {
        state.releaseSlot(slot, status: slot.lastStatus)
    }

    /// Pushes `ctx` onto `co`, made on the exchange's first hook that takes it.
    private func pushContext(_ co: OpaquePointer) {
        if contextRef == LUA_NOREF { contextRef = state.makeContext(config: config) }
        lua_rawgeti(co, Lua.registry, lua_Integer(contextRef))
    }

    private static func poisoned(_ state: LuaState) -> LuaCallResult {
        var result = LuaCallResult()
        result.outcome = .error(
            "\(state.script.name): the script's state was stopped by a limit; it is rebuilt for the next exchange")
        return result
    }
}

/// One `ctx` per (exchange, script) across the exchange's hooks: `on_request` (every try of
/// it), `on_response` (every try's head) and `on_log` see the same `ctx`, so what one hook puts
/// in `ctx.vars` the next reads, and the access log shows them all. The pipeline keeps an
/// exchange's `LuaExchange`s open (`keepOpen`) from its first hook and closes them at its end
/// (`close`); a hook run outside an open exchange (a test, `sluice lua test`) gets a fresh one.
///
/// Threading: the worker's thread, as the cache.
extension LuaStateCache {
    /// Bounds the table should an exchange never be closed: past it, the oldest ctx are
    /// dropped (their exchanges' later hooks start a fresh one).
    static let maxOpenExchanges = 65_536

    /// The open exchange of `requestID` on `state` with `config`, else a new one (not kept:
    /// the stage that takes the call keeps it, `keepOpen`).
    public func exchange(on state: LuaState, config: LuaConfig, limits: LuaLimits, requestID: UInt64) -> LuaExchange {
        openExchange(on: state, config: config, requestID: requestID)
            ?? state.makeExchange(config: config, limits: limits, requestID: requestID)
    }

    /// Where a hook of `script` with `config` for `requestID` runs: in the exchange kept open
    /// for it, if any (`open`), whatever its state — a state the cache no longer hands out (a
    /// reload retired its script, or another call's limit poisoned it) still holds that
    /// exchange's `ctx` — else in the worker's state for the script, where no exchange of
    /// this script and config is open (a new one is the caller's to make).
    public func state(
        for script: LuaScript, config: LuaConfig, limits: LuaLimits, requestID: UInt64
    ) throws(LuaLoadError) -> (state: LuaState, open: LuaExchange?) {
        if let open = openExchange(for: script, config: config, requestID: requestID) { return (open.state, open) }
        return (try state(for: script, limits: limits), nil)
    }

    /// The exchange kept open for `requestID` by `script` with `config`, whatever its state.
    private func openExchange(for script: LuaScript, config: LuaConfig, requestID: UInt64) -> LuaExchange? {
        guard !open.isEmpty else { return nil }
        return open[requestID]?.first {
            $0.config === config && $0.state.script.contentHash == script.contentHash && $0.state.script.name == script.name
        }
    }

    /// The exchange kept open (`keepOpen`) for `requestID` on `state` with `config`, if any.
    private func openExchange(on state: LuaState, config: LuaConfig, requestID: UInt64) -> LuaExchange? {
        // Most exchanges keep none open: no key is hashed for them.
        guard !open.isEmpty else { return nil }
        return open[requestID]?.first { $0.state === state && $0.config === config }
    }

    /// `exchange(on:…)` for an `on_request` that runs at once (not a call that may wait):
    /// the worker's spare exchange when it is for the same state and config, else a new one;
    /// `reusable` says whether `giveBack` may take it once the call is settled. An exchange
    /// per request cost an allocation and its release, some 350 instructions.
    func requestExchange(
        on state: LuaState, config: LuaConfig, limits: LuaLimits, requestID: UInt64
    ) -> (exchange: LuaExchange, reusable: Bool) {
        if let found = openExchange(on: state, config: config, requestID: requestID) { return (found, false) }
        if let exchange = spare, exchange.state === state, exchange.config === config {
            spare = nil
            exchange.reuse(limits: limits, requestID: requestID)
            return (exchange, true)
        }
        return (state.makeExchange(config: config, limits: limits, requestID: requestID), true)
    }

    /// Takes back an exchange `requestExchange` gave as reusable, once its call is settled,
    /// unless the call made a `ctx` (the exchange then stays open for the later hooks).
    func giveBack(_ exchange: LuaExchange) {
        if !exchange.hasContext { spare = exchange }
    }

    /// Keeps `exchange` open for its request's later hooks (once).
    public func keepOpen(_ exchange: LuaExchange) {
        let id = exchange.requestID
        if let kept = open[id] {
            if !kept.contains(where: { $0 === exchange }) { open[id] = kept + [exchange] }
            return
        }
        if open.count >= Self.maxOpenExchanges, let oldest = open.keys.min() { open[oldest] = nil }
        open[id] = [exchange]
    }

    /// Takes the last call's exchange (`lastExchange`) and keeps it open.
    public func keepLastExchangeOpen() {
        guard let exchange = lastExchange else { return }
        lastExchange = nil
        keepOpen(exchange)
    }

    /// Ends `requestID`'s exchanges: their `ctx` go back to their states.
    public func close(requestID: UInt64) {
        if !open.isEmpty { open[requestID] = nil }
    }
}

extension LuaCallRecord {
    /// One exchange's calls as the access log shows them: the first call that failed, else
    /// `later`; with every call's `ctx.vars` merged (later calls' values win: `ctx` is the
    /// same table across the hooks, so the last call's vars already hold the earlier ones
    /// unless a hook removed them) and every call counted for `sluice_lua_calls_total`.
    public static func combined(_ earlier: LuaCallRecord?, _ later: LuaCallRecord) -> LuaCallRecord {
        guard let earlier else { return later }
        let shown = earlier.outcome != "ok" ? earlier : later
        let vars = earlier.vars.merging(later.vars) { $1 }
        let other = shown === earlier ? later : earlier
        let counted =
            earlier.counted + later.counted + [LuaCallRecord(other, vars: [:], counted: [])]
        return LuaCallRecord(shown, vars: vars, counted: counted)
    }
}

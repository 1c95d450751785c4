import HTTPTypes

/// The `lua` interceptor's response half and its end (docs/scripting.md): `on_response` on
/// each try's final response head, before the exchange decides about it (so `res:retry()` is
/// a failed try the policy's `retry` counts), and `on_log` once the exchange ended, before its
/// access log line is written. Both share the exchange's `ctx` with `on_request`
/// (`LuaStateCache.exchange(on:…)`); each leaves its call's record in the worker's
/// `LuaStateCache.lastCall` for the stage that ran it.
///
/// Threading: as `LuaAdapter`: the exchange's worker thread.
extension LuaAdapter {
    /// What `on_response` made of a head.
    public enum ResponseAnswer: Equatable, Sendable {
        /// The head goes on (with the script's header edits, when it made any).
        case proceed
        /// `res:retry()`: the answer is a failed try; the `retry` policy decides.
        case retry
        /// `fail_closed` and the call failed: the client gets this 502, nothing of the response.
        case fail(ProxyError)
    }

    /// Runs `on_response` when the script defines it, on `view` (made by `make` on the first
    /// script that needs it, then shared by the policy's next scripts). A call that fails, or
    /// that changes `Content-Length` or `Transfer-Encoding` (the framing is the pipeline's),
    /// leaves `view` as it was: `fail_open` goes on with it, `fail_closed` answers 502.
    public func onResponse(
        _ view: inout LuaResponseView?, requestID: UInt64, making make: () -> LuaResponseView
    ) -> ResponseAnswer {
        let cache = LuaStateCache.current
        let state: LuaState
        do throws(LuaLoadError) {
            state = try cache.state(for: script, limits: limits)
        } catch {
            var result = LuaCallResult()
            result.outcome = .error(error.message)
            cache.lastCall = LuaCallRecord(script: script.name, hook: "on_response", result: result, vars: [:])
            return failedResponse(requestID)
        }
        guard state.hasOnResponse else { return .proceed }
        let before = view ?? make()
        var response = before
        let exchange = cache.exchange(on: state, config: config, limits: limits, requestID: requestID)
        cache.keepOpen(exchange)
        var result = exchange.onResponse(&response, restoringOnFailure: onError == .failOpen)
        if result.outcome == .ok, let refusal = refusal(response, before) {
            result.outcome = .error(refusal)
            response = before
        }
        cache.lastCall = LuaCallRecord(
            script: script.name, hook: "on_response", result: result, vars: result.outcome == .ok ? exchange.vars() : [:])
        guard result.outcome == .ok else {
            view = before
            return failedResponse(requestID)
        }
        view = response
        return result.retry ? .retry : .proceed
    }

    /// Runs `on_log` when the script defines it (read-only: `ctx` only); its `ctx.vars` go to
    /// the access log with the earlier hooks'.
    public func onLog(requestID: UInt64) {
        let cache = LuaStateCache.current
        guard let state = try? cache.state(for: script, limits: limits), state.hasOnLog else { return }
        let exchange = cache.exchange(on: state, config: config, limits: limits, requestID: requestID)
        let result = exchange.onLog()
        cache.lastCall = LuaCallRecord(
            script: script.name, hook: "on_log", result: result, vars: result.outcome == .ok ? exchange.vars() : [:])
    }

    /// Why the script's edits cannot be applied: a changed framing field, or a body set
    /// without `read_response_body`; nil when they can.
    private func refusal(_ edited: LuaResponseView, _ original: LuaResponseView) -> String? {
        for name in [HTTPField.Name.contentLength, .transferEncoding]
        where edited.headers[values: name] != original.headers[values: name] {
            return "\(script.name): res.headers: \(name.canonicalName) cannot be changed by a script (it frames the body)"
        }
        if edited.body != original.body {
            return "\(script.name): res:set_body is not supported by this version of the lua adapter"
        }
        return nil
    }

    private func failedResponse(_ requestID: UInt64) -> ResponseAnswer {
        onError == .failClosed ? .fail(.luaScriptFailed(script: script.name, requestID: requestID)) : .proceed
    }
}

extension ExchangeMachine {
    /// The exchange ends (`ended`, on a policy with scripts or after a script ran): each
    /// script of its policy runs `on_log`, then the exchange's `ctx` are closed. Before the
    /// `.finished` event is built, so that the access log line has what `on_log` put in
    /// `ctx.vars`. Here rather than in the I/O: the machine reads its policy without the
    /// exclusivity check an exchange's field costs, so a policy without scripts pays a load.
    mutating func runScriptsAtEnd() {
        let cache = LuaStateCache.current
        for script in policy.scripts {
            script.onLog(requestID: id)
            if let call = cache.lastCall {
                cache.lastCall = nil
                summary.lua = LuaCallRecord.combined(summary.lua, call)
            }
        }
        cache.close(requestID: id)
    }
}

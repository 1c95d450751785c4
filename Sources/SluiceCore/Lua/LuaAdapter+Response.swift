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
    ///
    /// The view's `body` is the response body the policy kept (`read_response_body`), nil
    /// when it kept none: a script with `read_response_body` reads and replaces it (`""` for a
    /// response that has no body: to `HEAD`, a `204`, a `304`), the others never see it.
    /// `bodyOverLimit`: the body was more than the policy keeps; a script that reads it, or
    /// one given a body over its own `limits.body`, fails its call with that limit unrun.
    public func onResponse(
        _ view: inout LuaResponseView?, requestID: UInt64, bodyOverLimit: Bool = false,
        making make: () -> LuaResponseView
    ) -> ResponseAnswer {
        let cache = LuaStateCache.current
        let state: LuaState
        let open: LuaExchange?
        do throws(LuaLoadError) {
            (state, open) = try cache.state(for: script, config: config, limits: limits, requestID: requestID)
        } catch {
            var result = LuaCallResult()
            result.outcome = .error(error.message)
            cache.lastCall = LuaCallRecord(script: script.name, hook: "on_response", result: result, vars: [:])
            return failedResponse(requestID)
        }
        guard state.hasOnResponse else { return .proceed }
        let before = view ?? make()
        if readResponseBody, bodyOverLimit || (before.body?.count ?? 0) > limits.body {
            return bodyOverLimits(before.body?.count, requestID, cache)
        }
        var response = before
        response.body = readResponseBody ? before.body ?? [] : nil
        let exchange = open ?? state.makeExchange(config: config, limits: limits, requestID: requestID)
        cache.keepOpen(exchange)
        var result = exchange.onResponse(&response, restoringOnFailure: onError == .failOpen)
        if result.succeeded, let refusal = refusal(response, before) {
            result.outcome = .error(refusal)
            response = before
        }
        cache.lastCall = LuaCallRecord(
            script: script.name, hook: "on_response", result: result, vars: result.succeeded ? exchange.vars() : [:])
        guard result.succeeded else {
            view = before
            return failedResponse(requestID)
        }
        if !readResponseBody || before.body == nil { response.body = before.body }
        view = response
        return result.retry ? .retry : .proceed
    }

    /// A script that reads the response body, given one over its `limits.body` (`size`; nil:
    /// more than its policy keeps): its call fails with that limit, unrun, as `on_error` says.
    private func bodyOverLimits(_ size: Int?, _ requestID: UInt64, _ cache: LuaStateCache) -> ResponseAnswer {
        var result = LuaCallResult()
        let bytes = size.map { " of \($0) bytes" } ?? ""
        result.outcome = .limit(
            .body, "\(script.name): on_response: the response body\(bytes) is over limits.body (\(limits.body))")
        cache.lastCall = LuaCallRecord(script: script.name, hook: "on_response", result: result, vars: [:])
        return failedResponse(requestID)
    }

    /// Runs `on_log` when the script defines it (read-only: `ctx` only); its `ctx.vars` go to
    /// the access log with the earlier hooks'.
    public func onLog(requestID: UInt64) {
        let cache = LuaStateCache.current
        // The exchange's `ctx`, in the state its first hook ran in (retired or poisoned since).
        guard let (state, open) = try? cache.state(for: script, config: config, limits: limits, requestID: requestID),
            state.hasOnLog
        else { return }
        let exchange = open ?? state.makeExchange(config: config, limits: limits, requestID: requestID)
        let result = exchange.onLog()
        cache.lastCall = LuaCallRecord(
            script: script.name, hook: "on_log", result: result, vars: result.succeeded ? exchange.vars() : [:])
    }

    /// Why the script's edits cannot be applied: a changed framing field, or a body set on a
    /// response that has none (without `read_response_body`, `res:set_body` itself fails);
    /// nil when they can.
    private func refusal(_ edited: LuaResponseView, _ original: LuaResponseView) -> String? {
        for name in [HTTPField.Name.contentLength, .transferEncoding]
        where edited.headers[values: name] != original.headers[values: name] {
            return "\(script.name): res.headers: \(name.canonicalName) cannot be changed by a script (it frames the body)"
        }
        if readResponseBody, original.body == nil, edited.body != [] {
            return "\(script.name): res:set_body: a response to HEAD, a 204 or a 304 has no body"
        }
        return nil
    }

    private func failedResponse(_ requestID: UInt64) -> ResponseAnswer {
        onError == .failClosed ? .fail(.luaScriptFailed(script: script.name, requestID: requestID)) : .proceed
    }
}

extension ExchangeMachine {
    /// The exchange ends (`ended`, on a policy with `on_log` or `on_response` scripts, after a
    /// call was recorded, or when a hook kept a `ctx` open — `keepsScriptContexts`): each
    /// script of its policy runs `on_log`, then the exchange's `ctx` are closed. Before the
    /// `.finished` event is built, so that the access log line has what `on_log` put in
    /// `ctx.vars`. Here rather than in the I/O: the machine reads its policy without the
    /// exclusivity check an exchange's field costs, so a policy without scripts pays a load.
    mutating func runScriptsAtEnd() {
        let cache = LuaStateCache.current
        for script in policy.scripts where script.hooks.contains(.onLog) {
            script.onLog(requestID: id)
            if let call = cache.lastCall {
                cache.lastCall = nil
                summary.lua = LuaCallRecord.combined(summary.lua, call)
            }
        }
        cache.close(requestID: id)
    }
}

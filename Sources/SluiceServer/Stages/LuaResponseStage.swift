import HTTPTypes
import SluiceCore

/// `lua` on the response's way back (docs/scripting.md): each script of the try's policy that
/// defines `on_response` runs on the try's final response head, in the policy's order, after
/// the circuit heard the status and before the exchange decides about the head — so a
/// `res:retry()` is a failed try the `retry` policy counts (and, with no retry left or none
/// configured, the response goes to the client as it is), and header edits reach the client
/// and the cache. A policy whose scripts define no `on_response` passes at once
/// (`runsResponseScripts`).
///
/// The script sees the head as it came (`res.status`, `res.headers`); its edits are applied
/// by giving the transfer a rebuilt head (`UpstreamTransfer.replaceHead`), which the encoder
/// checks and re-frames as any other. `Content-Length` and `Transfer-Encoding` are the
/// framing's: a script that changes them fails its call. A failed call with `fail_closed` (the
/// default) refuses the response — nothing of it has reached the client — and the client gets
/// `502` (`ProxyError.luaScriptFailed`, with the request id); with `fail_open` the head goes
/// on unchanged.
///
/// A policy with a script that reads the response body (`read_response_body`,
/// `HostPolicy.responseBodyLimit`) runs no script on a head that has a body: it asks the
/// transfer to keep the body (`UpstreamTransfer.collect`), and this stage and the ones after
/// it run again once it is kept (`ResponseChain.bodyStages`), with `ResponseHeadContext.kept`:
/// the scripts see it as `res:body()`, and `res:set_body(s)` replaces it. A body over that
/// limit runs them with `.overLimit`: the reading scripts' calls fail (`limits.body`), and the
/// response goes on to the client as it came (`fail_open`) or is refused (`fail_closed`).
///
/// Threading: stateless; run on the exchange's worker thread.
enum LuaResponseStage: ResponseStage {
    static var name: String { "lua" }

    static func head(
        _ response: inout ResponseHeadContext, _ exchange: Exchange, _ services: any StageServices
    )
        -> ResponseVerdict
    {
        // `TrustStage` set the try's policy: the one check a policy without `on_response` pays.
        guard exchange.tryPolicy?.runsResponseScripts == true, let policy = exchange.tryPolicy else { return .proceed }
        let head = response.response.collected
        if response.kept == nil, let limit = policy.responseBodyLimit, hasBody(head.status, exchange) {
            // The body first: the scripts, and the stages after them, run once it is kept —
            // with what the stages before them learnt of the head.
            exchange.keptHeldByOrigin = response.heldByOrigin
            response.transfer.collect(limit: limit)
            return .handled
        }
        var kept: [UInt8]?
        if case .whole(let body)? = response.kept?.content { kept = body }
        let overLimit = if case .overLimit? = response.kept?.content { true } else { false }
        var view: LuaResponseView?
        var original: HTTPFields?
        for script in policy.scripts where script.hooks.contains(.onResponse) {
            let answer = script.onResponse(&view, requestID: exchange.id, bodyOverLimit: overLimit) {
                var made = Self.view(of: head)
                made.body = kept
                original = made.headers
                return made
            }
            exchange.takeLuaCall()
            switch answer {
            case .proceed: continue
            case .retry: response.scriptRetry = true
            case .fail(let error):
                // A whole kept body's try has ended: the exchange fails it (`refusal`).
                if kept == nil { response.transfer.refuse(error) } else { response.kept?.refusal = error }
                return .handled
            }
        }
        if let view, view.headers != original {
            let edited = head.replacingFields(view.headers)
            if kept == nil { response.transfer.replaceHead(edited) }
            response.response = UpstreamResponseHead(collected: edited)
        }
        if let kept, let body = view?.body, body != kept {
            response.kept?.content = .whole(body)
            response.kept?.replaced = true
        }
        return .proceed
    }

    /// Whether the response to the exchange has a body to keep (not one to `HEAD`, nor a
    /// `204` or `304`).
    static func hasBody(_ status: Int, _ exchange: Exchange) -> Bool {
        status >= 200 && status != 204 && status != 304 && exchange.head.method != "HEAD"
    }

    /// The head as a script sees it: its status and field lines (a line without a valid
    /// name, which the encoder refuses anyway, is left out). Values keep their bytes: an
    /// obs-text value (a Latin-1 filename) reaches the script, and the client when the script
    /// edits another field, as the origin sent it (`HTTPField` stores what is not UTF-8 as
    /// bytes; `replacingFields` writes them back).
    static func view(of head: ResponseHeadCollector) -> LuaResponseView {
        var fields = HTTPFields()
        head.forEachField { name, value in
            guard let name = HTTPField.Name(String(decoding: name, as: UTF8.self)) else { return }
            fields.append(HTTPField(name: name, lenientValue: value))
        }
        return LuaResponseView(status: head.status, headers: fields)
    }
}

extension Exchange {
    /// Moves the last call a script ran on this worker into the exchange's record (beside its
    /// earlier calls, `LuaCallRecord.combined`), and keeps that call's `ctx` open for the
    /// exchange's later hooks. Called by the stages that run scripts, on a policy that has
    /// some (`runsScripts`).
    func takeLuaCall(_ cache: LuaStateCache = .current) {
        if cache.lastExchange != nil {
            if ended {
                // A late answer (the client left while the call waited): the exchange's end
                // closed what it kept already, and nothing would close this one.
                cache.lastExchange = nil
            } else {
                cache.keepLastExchangeOpen()
                machine.keepsScriptContexts = true
            }
        }
        guard let call = cache.lastCall else { return }
        cache.lastCall = nil
        summary.lua = LuaCallRecord.combined(summary.lua, call)
    }
}

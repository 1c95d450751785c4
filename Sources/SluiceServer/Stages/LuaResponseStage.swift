import HTTPTypes
import SluiceCore

/// `lua` on the response's way back (docs/scripting.md): each script of the try's policy that
/// defines `on_response` runs on the try's final response head, in the policy's order, after
/// the circuit heard the status and before the exchange decides about the head — so a
/// `res:retry()` is a failed try the `retry` policy counts (and, with no retry left or none
/// configured, the response goes to the client as it is), and header edits reach the client
/// and the cache. A policy without scripts passes at once (`runsScripts`).
///
/// The script sees the head as it came (`res.status`, `res.headers`); its edits are applied
/// by giving the transfer a rebuilt head (`UpstreamTransfer.replaceHead`), which the encoder
/// checks and re-frames as any other. `Content-Length` and `Transfer-Encoding` are the
/// framing's: a script that changes them fails its call. A failed call with `fail_closed` (the
/// default) refuses the response — nothing of it has reached the client — and the client gets
/// `502` (`ProxyError.luaScriptFailed`, with the request id); with `fail_open` the head goes
/// on unchanged.
///
/// Threading: stateless; run on the exchange's worker thread.
enum LuaResponseStage: ResponseStage {
    static var name: String { "lua" }

    static func head(
        _ response: inout ResponseHeadContext, _ exchange: Exchange, _ services: any StageServices
    )
        -> ResponseVerdict
    {
        // `TrustStage` set the try's policy: the one check a policy without scripts pays.
        guard exchange.tryPolicy?.runsScripts == true, let policy = exchange.tryPolicy else { return .proceed }
        var view: LuaResponseView?
        var original: HTTPFields?
        let head = response.response.collected
        for script in policy.scripts {
            let answer = script.onResponse(&view, requestID: exchange.id) {
                let made = Self.view(of: head)
                original = made.headers
                return made
            }
            exchange.takeLuaCall()
            switch answer {
            case .proceed: continue
            case .retry: response.scriptRetry = true
            case .fail(let error):
                response.transfer.refuse(error)
                return .handled
            }
        }
        if let view, view.headers != original {
            let edited = head.replacingFields(view.headers)
            response.transfer.replaceHead(edited)
            response.response = UpstreamResponseHead(collected: edited)
        }
        return .proceed
    }

    /// The head as a script sees it: its status and field lines (a line without a valid
    /// name, which the encoder refuses anyway, is left out).
    static func view(of head: ResponseHeadCollector) -> LuaResponseView {
        var fields = HTTPFields()
        head.forEachField { name, value in
            guard let name = HTTPField.Name(String(decoding: name, as: UTF8.self)) else { return }
            fields.append(HTTPField(name: name, value: String(decoding: value, as: UTF8.self)))
        }
        return LuaResponseView(status: head.status, headers: fields)
    }
}

extension Exchange {
    /// Moves the last call a script ran on this worker into the exchange's record (beside its
    /// earlier calls, `LuaCallRecord.combined`), and keeps that call's `ctx` open for the
    /// exchange's later hooks. Called by the stages that run scripts, on a policy that has
    /// some (`runsScripts`).
    func takeLuaCall() {
        let cache = LuaStateCache.current
        cache.keepLastExchangeOpen()
        guard let call = cache.lastCall else { return }
        cache.lastCall = nil
        summary.lua = LuaCallRecord.combined(summary.lua, call)
    }
}

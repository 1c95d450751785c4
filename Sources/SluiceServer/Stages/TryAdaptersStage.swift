import SluiceCore

/// `adapters` that run on every try (`AdapterTiming.everyTry`: `aws_sigv4`, `http_signature`,
/// docs/configuration.md, "Adapters"): after the circuit and the rate limit gave the try its
/// turn — so that a signer's date is the moment the try leaves, even after a wait — the
/// try's request model is adapted by each of them in the policy's order, and the header lines
/// the transport sends is built again from it. Each try (a retry, a followed redirect) starts
/// from the request as the once-per-exchange adapters left it, so a signature never covers an
/// earlier try's edits.
///
/// An adapter that reads the body (`readsBody`) is given the copy `RequestBodyStage` read
/// whole, which is also what every try sends; the try then goes with that body's length
/// (`Content-Length`, which the adapter sees in the fields) rather than chunked. A script that
/// replaces it (`req:set_body`, `ProxyRequest.replacedBody`) makes this try send its body
/// instead, with its length; the adapters after it are given that body. The next try starts
/// from the body read again, and the script, running again, sets its body again.
///
/// An adapter's local answer (a script's `req:respond`, `ProxyError.luaResponded`) answers
/// the client as a refusal would, and this try is never sent.
enum TryAdaptersStage: TryStage {
    static var name: String { "try_adapters" }

    static func enter(_ request: inout UpstreamRequest, _ exchange: Exchange, _ services: any StageServices) -> TryVerdict {
        let policy = exchange.tryPolicy ?? exchange.policy
        let adapters = policy.tryAdapters
        guard !adapters.isEmpty else { return .proceed }
        guard var model = request.model else {
            return .respond(.adapterFailed(name: adapters[0].name, reason: "the request was not built for adapters"))
        }
        var body: [UInt8]?
        if policy.bodyReader != nil, request.body != .none {
            guard let kept = exchange.body.replay, exchange.body.canReplay(clientBodyDone: true) else {
                let name = policy.bodyReader ?? adapters[0].name
                return .respond(.adapterFailed(name: name, reason: "the request body was not read whole"))
            }
            body = kept
            request.body = .length(Int64(kept.count))
            model.body = .length(Int64(kept.count))
            model.headerFields[.contentLength] = String(kept.count)
        }
        model.replacedBody = nil
        var context = TryContext(
            body: body, wallClockMilliseconds: exchange.inspect { $0.clock.wallClockMilliseconds() },
            attempt: exchange.summary.attempts + 1)
        for adapter in adapters {
            do throws(AdaptationError) {
                try adapter.adaptTry(&model, context)
                if let replaced = model.replacedBody { context.body = replaced }
            } catch {
                if policy.runsScripts { exchange.takeLuaCall() }
                return .respond(error.proxyError)
            }
        }
        if policy.runsScripts { exchange.takeLuaCall() }
        if policy.bodyReader != nil {
            if let replaced = model.replacedBody { request.body = .length(Int64(replaced.count)) }
            exchange.body.replaceForThisTry(model.replacedBody)
        }
        if model.url != request.target.url {
            do throws(ProxyError) {
                request.target = try RequestTarget.absolute(model.url)
            } catch {
                return .respond(error)
            }
        }
        // A script's method (`req.method`, never to or from HEAD) goes with this try.
        request.method = model.method
        request.headers = services.headerLines(for: model.headerFields)
        request.model = model
        return .proceed
    }
}

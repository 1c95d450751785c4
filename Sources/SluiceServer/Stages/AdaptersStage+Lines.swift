import SluiceCore

extension AdaptersStage {
    /// `HostPolicy.scriptsOnLines`: the policy's scripts run here, in place and in order, on
    /// the header lines the request is forwarded with (the head's, with the header edits of
    /// `modelHeaderPlan`, the request id and the forwarding fields), read where the worker's
    /// line builder holds them (`scriptLines`); their header edits are made in that builder
    /// before `Via` (`scriptedLines`): no request model is built and encoded again. A script
    /// that changes the method or the URL, which the lines do not carry, leaves a model as the
    /// adapters would have (its fields built from the lines). The machine answers as for the
    /// adapters (`ExchangeMachine.scriptsRan`).
    static func runScriptsOnLines(_ exchange: Exchange, _ services: any StageServices) -> StageVerdict {
        // The head's method, not the head: a copy of `exchange.head` retained every array of it.
        let url = exchange.target.url
        let method = exchange.head.method
        // The view holds the only other copy of the worker's builder (no local one: the
        // builder is finished below once the view lets it go, without copying its buffers).
        var view = LuaRequestView(
            method: method, url: url, lines: services.scriptLines(for: exchange, edits: exchange.policy.modelHeaderPlan))
        let cache = LuaStateCache.current
        swap(&view.lineEdits, &cache.spareLineEdits)
        var edited: String?
        let recording = exchange.pipeline.recordsEveryScriptCall
        for script in exchange.policy.scripts {
            do throws(AdaptationError) {
                if let made = try script.runOnLines(
                    &view, url: edited ?? url, requestID: exchange.id, cache: cache, recordingSuccess: recording)
                {
                    edited = made
                }
            } catch {
                // Answered here, not carried out of the loop: an optional error tested after
                // each script was copied and destroyed each time (some 450 instructions).
                exchange.takeLuaCall(cache)
                return answered(exchange, exchange.machine.scriptsRan(.failure(error)))
            }
            exchange.takeLuaCall(cache)
        }
        if edited != nil || view.method != method {
            view.materializeHeaders()
            let model = ProxyRequest(
                id: exchange.id, method: view.method, url: edited ?? url, headerFields: view.headers,
                body: bodyMode(exchange.head))
            return answered(exchange, exchange.machine.scriptsRan(.success(model)))
        }
        if view.hasLines {
            var edits = LuaLineEdits()
            swap(&edits, &view.lineEdits)
            // The view goes first: its copy of the builder shares the buffers the builder
            // appends to next.
            _ = consume view
            exchange.forwardedLines = .scripted(services.scriptedLines(edits))
            edits.removeAll()
            cache.spareLineEdits = edits
        } else {
            exchange.forwardedLines = .scripted(services.headerLines(for: view.headers))
        }
        return answered(exchange, exchange.machine.scriptsRan(.success(nil)))
    }

    private static func answered(
        _ exchange: Exchange, _ answer: ExchangeMachine.Answer<ExchangeMachine.AdaptedAction>
    ) -> StageVerdict {
        exchange.report(answer.reports)
        switch answer.command {
        case .forward?: return .proceed
        case .fail(let error)?: return .respond(error)
        case .buildRetry?, nil:
            // The pipeline runs once per exchange: a second run is a bug, never a request.
            return .respond(.malformedRequest("the request's pipeline ran twice"))
        }
    }
}

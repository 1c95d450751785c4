import CCurl
import CLibEvent
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// A request's way from its parsed head to an upstream try: the exchange and its policy
/// (with any `upstream:` override), the adapters, the request for the session core, and each
/// try's TLS settings. What happens when is the exchange's `ExchangeMachine`'s to decide;
/// `feed` hands it an event and performs what it answers.
extension ClientConnection {
    /// Creates the exchange: matches the policy and reports the request to the monitors.
    func beginExchange(_ head: HTTPRequestHead, _ target: RequestTarget) throws(ProxyError) -> Exchange {
        let pipeline = worker.pipeline
        let policy = pipeline.policies.match(host: target.host)
        let id = worker.nextRequestID()
        let method = head.method
        let url = head.methodIs("CONNECT") ? target.authority : target.url
        var target = target
        var hostHeader: (value: String, target: RequestTarget)?
        if let override = policy.upstream, !head.methodIs("CONNECT"), target.scheme == .http {
            // Only a plain-HTTP request is redirected (never an https one downgraded).
            let original = target
            target = try target.overridden(by: override)
            if target.port != original.port {
                // The origin is asked for by the name the client used (virtual hosting).
                hostHeader = (
                    original.port != 80
                        ? original.authority
                        : original.host.utf8.contains(0x3A) ? "[\(original.host)]" : original.host, target
                )
            }
        }
        var summary = ExchangeSummary(id: id, client: peer, method: method, url: url, policy: policy.name)
        let clientRequestId = ForwardedHeaders.requestId(of: head)
        let generatedRequestId = clientRequestId == nil ? worker.makeRequestId(id) : nil
        summary.requestId = clientRequestId ?? generatedRequestId
        summary.host = target.host
        let monitoring: ExchangeMachine.Monitoring =
            pipeline.monitor.map { $0.wantsRequestDetails ? .detailedEvents : .events } ?? .none
        let replayLimit = head.hasBody ? ExchangeMachine.replayLimit(for: policy) : 0
        // The machine is built in place and `summary` not read after: a copy of either costs
        // a few hundred bytes and a retain per field.
        let exchange = Exchange(
            pipeline: pipeline,
            machine: ExchangeMachine(
                summary: summary, policy: policy, target: .init(target),
                defaultPerTryTimeout: worker.config.timeouts.upstreamPerTry,
                monitoring: monitoring, events: pipeline.monitor?.events ?? []),
            target: target, body: RequestBodyReader(encoders: [], replayLimit: replayLimit))
        exchange.hostHeader = hostHeader
        exchange.generatedRequestId = generatedRequestId
        self.exchange = exchange
        exchange.report(exchange.machine.handle(.received))
        return exchange
    }

    /// Hands `event` to the exchange's machine, then performs its answer: the reports go to
    /// the monitors, then the command runs. (Commands that answer an event fed elsewhere —
    /// a try's start, a response head's disposition — are performed where it is fed.)
    func feed(_ event: ExchangeMachine.Event, _ exchange: Exchange) {
        let actions = exchange.machine.handle(event)
        exchange.report(actions)
        guard let command = actions.command else { return }
        switch command {
        case .adapt(let request):
            adapt(request, exchange)
        case .forward(let edits):
            guard let head = currentHead else { return }
            if let edits { exchange.headerEdits = edits }
            startWhenReady(head, exchange)
        case .buildRetry:
            guard let head = currentHead else { return }
            if head.hasBody { exchange.body.rewindForReplay() }
            do {
                startTry(try upstreamRequest(head, exchange), exchange)
            } catch {
                respondError(error)
            }
        case .scheduleRetry(let delay):
            startRetryTimer(delay)
        case .fail(let error):
            if exchange.cache?.revalidating != nil, serveStaleOnError(error, exchange) { return }
            respondError(error)
        case .report, .beginTry, .sendResponse, .discardResponse, .checkRedirect, .followRedirect:
            assertionFailure("\(command) is performed where its event is fed")
        }
    }

    /// Whether the request body could be sent again right now: there is none, or all of it
    /// was read and kept.
    func canResendBody(_ exchange: Exchange) -> Bool {
        !(currentHead?.hasBody ?? false) || exchange.body.canReplay(clientBodyDone: requestBodyDone)
    }

    static func bodyMode(_ head: HTTPRequestHead) -> ProxyRequest.Body {
        switch head.framing {
        case .none: return .none
        case .length(let n): return .length(n)
        case .chunked: return .streamed
        }
    }

    /// Runs the pipeline: the machine says whether the adapters run (on a request model
    /// built here only when it needs one) or the request goes out as it came.
    func prepare(_ head: HTTPRequestHead, _ exchange: Exchange) {
        var model: ProxyRequest?
        if exchange.inspect({ $0.needsRequestModel }) {
            var fields = ForwardedHeaders.forwardedFields(of: head, forwarding: forwarding)
            if let generated = exchange.generatedRequestId { fields[ForwardedHeaders.requestIdName] = generated }
            model = ProxyRequest(
                id: exchange.id, method: head.method, url: exchange.target.url,
                headerFields: fields, body: Self.bodyMode(head))
        }
        feed(.prepare(model: model), exchange)
    }

    /// Runs the policy's adapters on `request`; an adapter that must wait (a token fetch)
    /// answers later on this thread, while the connection holds its input.
    private func adapt(_ request: ProxyRequest, _ exchange: Exchange) {
        state = .adapting
        exchange.policy.interceptor.adapt(request, for: worker.sessionContext) { [weak self] result in
            guard let self, self.exchange === exchange, case .adapting = self.state else { return }
            self.state = .awaitingHead
            self.feed(.adapted(result), exchange)
        }
        if self.exchange === exchange, case .adapting = exchange.machine.state {
            exchange.report(exchange.machine.handle(.adaptationSuspended))
        }
    }

    func startWhenReady(_ head: HTTPRequestHead, _ exchange: Exchange) {
        if head.framing == .chunked {
            startWhenBodyIsValid(head, exchange)
        } else {
            startForwarding(head, exchange)
        }
    }

    /// The request for the session core: from the adapted model when there is one, else
    /// straight from the head's bytes (the fast path: no per-field strings).
    func upstreamRequest(_ head: HTTPRequestHead, _ exchange: Exchange) throws(ProxyError) -> UpstreamRequest {
        guard let model = exchange.model else {
            let body: UpstreamRequest.Body
            switch head.framing {
            case .none: body = .none
            case .length(let n): body = .length(n)
            case .chunked: body = .streamed
            }
            return UpstreamRequest(
                method: head.method, target: exchange.target,
                headers: ForwardedHeaders.requestList(
                    for: head, viaLine: worker.viaRequestLine,
                    edits: exchange.headerEdits,
                    requestId: exchange.generatedRequestId,
                    forwarding: forwarding,
                    builder: &worker.headerBuilder),
                body: body, model: nil,
                credentials: challengeCredentials(head, exchange))
        }
        // Adapters rarely change the URL: the target parsed from the head is reused then.
        var request = try upstreamRequest(for: model, target: model.url == exchange.target.url ? exchange.target : nil)
        request.credentials = challengeCredentials(head, exchange)
        return request
    }

    /// The policy's credentials, when a challenge could be answered: answering means sending
    /// the body again, so a body must have been read whole first (within the replay limit).
    /// Otherwise the 401 goes to the client unchanged.
    func challengeCredentials(_ head: HTTPRequestHead, _ exchange: Exchange) -> Credentials? {
        guard let credentials = exchange.policy.credentials else { return nil }
        if head.hasBody && !exchange.body.canReplay(clientBodyDone: requestBodyDone) { return nil }
        return credentials
    }

    func upstreamRequest(for model: ProxyRequest, target parsed: RequestTarget? = nil) throws(ProxyError) -> UpstreamRequest {
        let target: RequestTarget
        if let parsed { target = parsed } else { target = try RequestTarget.absolute(model.url) }
        let body: UpstreamRequest.Body
        switch model.body {
        case .none: body = .none
        case .length(let n): body = model.bodyEncoders.isEmpty ? .length(n) : .streamed
        case .streamed: body = .streamed
        }
        return UpstreamRequest(
            method: model.method, target: target,
            headers: ForwardedHeaders.requestList(
                for: model.headerFields, viaLine: worker.viaRequestLine,
                builder: &worker.headerBuilder),
            body: body, model: model)
    }

    func startForwarding(_ head: HTTPRequestHead, _ exchange: Exchange) {
        event_del(timer)
        let request: UpstreamRequest
        do {
            request = try upstreamRequest(head, exchange)
        } catch {
            respondError(error)
            return
        }
        if let model = exchange.model, !model.bodyEncoders.isEmpty {
            exchange.body.setEncoders(model.bodyEncoders.map { $0.makeEncoder() })
        }
        sendContinueIfExpected(head)
        if case .length(let n) = head.framing, exchange.inspect({ $0.readsBodyWhole(length: n) }) {
            continueBuffering(head, exchange)
            return
        }
        startTry(request, exchange)
    }

    /// Starts a try of `request` when its host's trust allows it and the machine agrees
    /// (the retry deadline has not passed).
    func startTry(_ request: UpstreamRequest, _ exchange: Exchange) {
        var request = request
        exchange.target = request.target
        // The policy of the host the try goes to (a followed redirect may have changed it):
        // its parent proxy, and for TLS its trust.
        let policy =
            request.target.host == exchange.policyHost
            ? exchange.policy : exchange.pipeline.policies.match(host: request.target.host)
        request.parentProxy = policy.upstreamProxy
        request.http2 = policy.http2
        if request.target.scheme == .https {
            guard policy.trust.isAllowed else {
                transferFailed(policy.trust.refusal(authority: request.target.authority), kind: .other)
                return
            }
            request.trust = policy.trust
            request.clientCertificate = policy.clientCertificate
            request.reuse = UpstreamTLS.reuse(current: worker.pipeline, exchangeSnapshot: exchange.pipeline)
            if policy.trust.requirements.insecure { exchange.summary.insecure = true }
        }
        if let health = policy.health, !admitToOrigin(request.target, health, exchange) { return }
        if let host = exchange.hostHeader, request.target == host.target {
            request.headers = request.headers.appending(name: "Host", value: host.value)
        }
        if exchange.cache != nil { applyCacheValidators(&request, exchange) }
        let actions = exchange.machine.handle(.tryStarting(.init(request.target)))
        exchange.report(actions)
        guard case .beginTry(let perTryTimeout)? = actions.command else {
            reportTryOutcome(.abandoned)
            if case .fail(let error)? = actions.command { respondError(error) }
            return
        }
        if let upgrade = exchange.upgrade {
            startUpgrade(request, upgrade: upgrade, perTryTimeout: perTryTimeout, exchange)
            return
        }
        let engine = UpstreamEngine.choose(
            https: request.target.scheme == .https, http2: policy.http2,
            forced: policy.upstreamEngine, credentials: request.credentials != nil,
            parentProxy: request.parentProxy != nil, upgrade: false
        ).engine
        let transfer: any UpstreamTransfer
        switch engine {
        case .native:
            transfer = NativeUpstreamTransfer(
                pool: worker.nativePool, resolver: worker.resolver, delegate: self,
                bodySource: self, output: clientOutput, request: request,
                clientMinorVersion: currentHead?.minorVersion ?? 1,
                config: worker.config, viaLine: worker.viaLine)
        case .curl:
            transfer = CurlUpstreamTransfer(
                session: worker.session, delegate: self, bodySource: self,
                output: clientOutput, request: request,
                clientMinorVersion: currentHead?.minorVersion ?? 1,
                config: worker.config, viaLine: worker.viaLine)
        }
        state = .forwarding(transfer)
        transfer.start(perTryTimeout: perTryTimeout)
    }
}

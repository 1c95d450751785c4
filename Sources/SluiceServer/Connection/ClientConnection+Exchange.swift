#if canImport(Glibc)
import Glibc
#endif
import CCurl
import CLibEvent
import SluiceCore

/// A request's way from its parsed head to an upstream try: the exchange and its policy
/// (with any `upstream:` override), the adapters (or their header-edit plan), the request
/// for the session core, and each try's TLS settings.
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
                hostHeader = (original.port != 80 ? original.authority
                    : original.host.contains(":") ? "[\(original.host)]" : original.host, target)
            }
        }
        let summary = ExchangeSummary(id: id, client: peer, method: method, url: url, policy: policy.name)
        let exchange = Exchange(id: id, pipeline: pipeline, policy: policy, summary: summary, target: target,
                                body: RequestBodyReader(encoders: [], replayLimit: head.hasBody ? Self.replayLimit(policy) : 0))
        exchange.hostHeader = hostHeader
        policy.retryBudgets?.budget(for: target.host).recordRequest()
        self.exchange = exchange
        pipeline.monitor?.handle(.requestReceived(id: id, client: peer, method: method, url: url, policy: policy.name))
        return exchange
    }

    static func bodyMode(_ head: HTTPRequestHead) -> ProxyRequest.Body {
        switch head.framing {
        case .none: return .none
        case .length(let n): return .length(n)
        case .chunked: return .streamed
        }
    }

    /// Runs the policy's adapters (when it has any, or when monitors or redirects need the
    /// request model), then starts forwarding.
    func prepare(_ head: HTTPRequestHead, _ exchange: Exchange) {
        let policy = exchange.policy
        let needsModel = !policy.adapters.isEmpty || policy.redirector.follows
            || exchange.monitor?.wantsRequestDetails == true
        guard needsModel else { return startWhenReady(head, exchange) }
        if let plan = policy.headerEditPlan, !policy.redirector.follows, exchange.monitor?.wantsRequestDetails != true {
            // Adapters that only edit header fields: applied as the header list is built.
            exchange.headerEdits = plan
            exchange.monitor?.handle(.requestAdapted(id: exchange.id, adapters: policy.adapterNames))
            return startWhenReady(head, exchange)
        }
        let model = ProxyRequest(id: exchange.id, method: head.method, url: exchange.target.url,
                                 headerFields: ForwardedHeaders.forwardedFields(of: head), body: Self.bodyMode(head))
        if policy.adapters.isEmpty {
            exchange.model = model
            return startWhenReady(head, exchange)
        }
        exchange.originalModel = model
        state = .adapting
        policy.interceptor.adapt(model, for: worker.sessionContext) { [weak self] result in
            guard let self, self.exchange === exchange, case .adapting = self.state else { return }
            switch result {
            case .success(let adapted):
                exchange.model = adapted
                exchange.monitor?.handle(.requestAdapted(id: exchange.id, adapters: policy.adapters.map(\.adapter.name)))
                self.state = .awaitingHead
                self.startWhenReady(head, exchange)
            case .failure(let error):
                exchange.monitor?.handle(.adaptationFailed(id: exchange.id, error: error))
                self.state = .awaitingHead
                self.respondError(.adapterFailed(name: error.adapter, reason: error.reason))
            }
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
            return UpstreamRequest(method: head.method, target: exchange.target,
                                   headers: ForwardedHeaders.requestList(for: head, via: worker.via, edits: exchange.headerEdits),
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
        return UpstreamRequest(method: model.method, target: target,
                               headers: ForwardedHeaders.requestList(for: model.headerFields, via: worker.via),
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
        if shouldBufferWholeBody(head, exchange) {
            curl_slist_free_all(request.headers)
            continueBuffering(head, exchange)
            return
        }
        startTry(request, exchange)
    }

    func startTry(_ request: UpstreamRequest, _ exchange: Exchange) {
        var request = request
        exchange.target = request.target
        if request.target.scheme == .https {
            // The trust of the host the try goes to (a followed redirect may have changed it).
            let policy = request.target.host == exchange.policyHost ? exchange.policy : exchange.pipeline.policies.match(host: request.target.host)
            guard policy.trust.isAllowed else {
                curl_slist_free_all(request.headers)
                transferFailed(policy.trust.refusal(authority: request.target.authority), kind: .other)
                return
            }
            request.trust = policy.trust
            request.clientCertificate = policy.clientCertificate
            request.reuse = UpstreamTLS.reuse(current: worker.pipeline, exchangeSnapshot: exchange.pipeline)
            if policy.trust.requirements.insecure { exchange.summary.insecure = true }
        }
        if let host = exchange.hostHeader, request.target == host.target {
            request.headers = curl_slist_append(request.headers, "Host: \(host.value)")
        }
        exchange.summary.attempts += 1
        let transfer = UpstreamTransfer(session: worker.session, delegate: self, request: request,
                                        clientMinorVersion: currentHead?.minorVersion ?? 1,
                                        config: worker.config, via: worker.via)
        state = .forwarding(transfer)
        if let monitor = exchange.monitor, let model = request.model {
            monitor.handle(.tryStarted(id: exchange.id, attempt: exchange.summary.attempts, request: model))
        }
        guard let perTry = perTryTimeout(exchange) else {
            transfer.cancel()
            respondError(.upstreamTimeout(host: request.target.authority, phase: .retryDeadlinePassed))
            return
        }
        transfer.start(perTryTimeout: perTry)
    }
}

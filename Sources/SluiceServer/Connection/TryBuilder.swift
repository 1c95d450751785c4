import SluiceCore

/// Builds what goes upstream: an exchange's try as an `UpstreamRequest` — from the head's bytes
/// on the plain path, from the adapted request model otherwise — and the transfer that carries
/// a try over the route the try stages chose (Sluice's own HTTP/1.1 client or libcurl). The
/// driver's tries, a resume's and a shared fill's producer all get theirs here.
///
/// Threading: a view of its worker (it stores nothing of its own), made when used, on the
/// worker's thread.
struct TryBuilder {
    unowned(unsafe) let worker: Worker

    /// The request for the session core: from the adapted model when there is one, else
    /// straight from the head's bytes (the fast path: no per-field strings). `canResendBody`:
    /// a credentials challenge may be answered (`credentials(_:canResendBody:)`).
    func request(_ exchange: Exchange, canResendBody: Bool) throws(ProxyError) -> UpstreamRequest {
        let head = exchange.head
        guard let model = exchange.model else {
            let body: UpstreamRequest.Body
            switch head.framing {
            case .none: body = .none
            case .length(let n): body = .length(n)
            case .chunked: body = .streamed
            }
            let headers: RequestHeaderLines
            switch exchange.forwardedLines {
            case .scripted(let lines)?: headers = lines
            case .edits(let edits)?: headers = worker.headerLines(for: exchange, edits: edits)
            case nil: headers = worker.headerLines(for: exchange, edits: nil)
            }
            return UpstreamRequest(
                method: head.method, target: exchange.target, headers: headers, body: body, model: nil,
                credentials: credentials(exchange, canResendBody: canResendBody))
        }
        // Adapters rarely change the URL: the target parsed from the head is reused then.
        var request = try self.request(for: model, target: model.url == exchange.target.url ? exchange.target : nil)
        request.credentials = credentials(exchange, canResendBody: canResendBody)
        return request
    }

    /// The request for `model` (a followed redirect's, or an adapted one's), to `parsed` when
    /// the caller has its URL parsed already.
    func request(for model: ProxyRequest, target parsed: RequestTarget? = nil) throws(ProxyError) -> UpstreamRequest {
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
            headers: ForwardedHeaders.requestLines(
                for: model.headerFields, viaLine: worker.viaRequestLine,
                builder: &worker.headerBuilder),
            body: body, model: model)
    }

    /// The policy's credentials, when a challenge could be answered: answering means sending
    /// the body again, so a body must have been read whole first (within the replay limit).
    /// Otherwise the 401 goes to the client unchanged.
    func credentials(_ exchange: Exchange, canResendBody: Bool) -> Credentials? {
        guard let credentials = exchange.policy.credentials, canResendBody else { return nil }
        return credentials
    }

    /// The transfer for a try the try stages sent by `route` (not an upgrade's: that is an
    /// `UpgradeTransfer`, which the driver makes); nil for an upgrade route. It reports to
    /// `delegate`, reads the request body from `bodySource` and writes the response to `output`.
    func transfer(
        _ request: consuming UpstreamRequest, route: UpstreamRoute, delegate: any UpstreamTransferDelegate,
        bodySource: any RequestBodySource, output: OpaquePointer, clientMinorVersion: Int
    ) -> (transfer: any UpstreamTransfer, perTryTimeout: Int)? {
        switch route {
        case .native(let perTryTimeout):
            let transfer = NativeUpstreamTransfer(
                pool: worker.nativePool, resolver: worker.resolver, delegate: delegate,
                bodySource: bodySource, output: output, request: request,
                clientMinorVersion: clientMinorVersion, config: worker.config, viaLine: worker.viaLine)
            return (transfer, perTryTimeout)
        case .curl(let perTryTimeout):
            let transfer = CurlUpstreamTransfer(
                session: worker.session, delegate: delegate, bodySource: bodySource,
                output: output, request: request, clientMinorVersion: clientMinorVersion,
                config: worker.config, viaLine: worker.viaLine)
            return (transfer, perTryTimeout)
        case .upgrade:
            return nil
        }
    }

    /// The transfer that asks `peer`, an instance of the fleet, for `request` (`PeerHop`).
    /// Not optimised: Swift 6.3.1's existential specialisation of this function fails the
    /// compiler's own SIL verification (a crash at build time); it runs once per peer asked.
    @_optimize(none)
    func peerTransfer(
        _ request: UpstreamRequest, to peer: UpstreamOrigin, delegate: any UpstreamTransferDelegate,
        bodySource: any RequestBodySource, output: OpaquePointer, clientMinorVersion: Int
    ) -> NativeUpstreamTransfer {
        NativeUpstreamTransfer(
            pool: worker.nativePool, resolver: worker.resolver, delegate: delegate, bodySource: bodySource,
            output: output, request: request, clientMinorVersion: clientMinorVersion, config: worker.config,
            viaLine: worker.viaLine, peer: peer)
    }
}

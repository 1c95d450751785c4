import SluiceCore

/// The `LuaHost` of one worker (docs/scripting.md, "sluice.http"): a script's sub-request goes
/// to this Sluice's own proxy listener on loopback, as a client's forward-proxy request would,
/// so the target host's whole policy applies to it (adapters, retries, circuit, rate limit,
/// cache) and `access` too; it carries its depth (`LuaSubrequest.depthHeader`) so scripts
/// that call each other stop at `LuaSubrequest.maxDepth`. Timers are on the worker's loop.
///
/// Threading: owned by its worker's `WorkerSession`, on the worker's thread. Every operation
/// in flight is known here and cancelled by `close()`, before the worker frees its loop.
final class WorkerLuaHost: LuaHost {
    private unowned let worker: Worker
    /// `http://ADDRESS:PORT` of the first proxy listener, a wildcard address read as loopback;
    /// nil when Sluice has none it can reach.
    private let listener: String?
    /// The admin listener's host (lower case, unbracketed) and port.
    private let admin: (host: String, port: Int)?
    private var live: [ObjectIdentifier: any LuaOperation] = [:]

    init(worker: Worker) {
        self.worker = worker
        listener = worker.config.listen.lazy.compactMap(Self.loopbackURL).first
        admin = worker.config.admin.flatMap { Self.split($0.listen) }
    }

    func close() {
        let operations = live.values
        live = [:]
        for operation in operations { operation.cancel() }
    }

    func subrequest(
        _ request: LuaSubrequest, completion: @escaping (Result<LuaSubresponse, LuaOperationError>) -> Void
    ) -> any LuaOperation {
        let operation = Operation(host: self)
        operation.completion = completion
        guard let listener else {
            return operation.answer(.failure(LuaOperationError("this Sluice has no proxy listener to send it to")))
        }
        var headers = request.headers
        let parts = URLParts(request.url)
        let policy = worker.pipeline.policies.match(host: parts.host)
        // The depth goes where this Sluice reads it and drops it: a plain-http request, or an
        // https one whose CONNECT the policy intercepts. Through a tunnel Sluice does not open,
        // libcurl would send it inside the TLS to the origin, token and all (and no script of
        // this Sluice runs on what a tunnel carries).
        let https = parts.scheme.lowercased() == "https"
        if !https || policy.intercept {
            headers.append((LuaSubrequest.depthHeader, LuaSubrequest.headerValue(depth: request.depth)))
        }
        // libcurl adds fields the script did not write — `Accept: */*`, a form `Content-Type`
        // on a body, `Expect: 100-continue` on a large one — unless told not to by a field
        // with no value: the request carries the script's fields only (as `sluice lua test`
        // prints them).
        for name in ["Accept", "Content-Type", "Expect"]
        where !headers.contains(where: { $0.0.lowercased() == name.lowercased() }) {
            headers.append((name, ""))
        }
        // Intercepted, the TLS inside the tunnel is with this Sluice, under its own CA.
        let interceptionCA = https && policy.intercept ? worker.interception.current?.caPEM : nil
        let fetch = SideFetch(
            session: worker.session, config: worker.config,
            policy: policy,
            url: request.url, headers: headers, body: request.body,
            reuse: UpstreamTLS.reuse(current: worker.pipeline, exchangeSnapshot: nil),
            interceptionCA: interceptionCA
        ) { [operation] result in
            operation.fetched(result)
        }
        fetch.maxBytes = request.maxBody
        fetch.fieldsSink = { [operation] fields in operation.fields = fields }
        fetch.route(
            throughListener: listener, method: request.method, hasBody: request.body != nil,
            timeoutMilliseconds: Int((request.timeoutMicroseconds + 999) / 1000))
        operation.fetch = fetch
        live[ObjectIdentifier(operation)] = operation
        fetch.start()
        return operation
    }

    func timer(microseconds: Int64, _ fired: @escaping () -> Void) -> any LuaOperation {
        let timer = Timer(host: self, fired: fired)
        live[ObjectIdentifier(timer)] = timer
        timer.event = LoopTimer(on: worker.base, owner: timer) { $0.fire() }
        timer.event?.arm(microseconds: Int(max(0, microseconds)))
        return timer
    }

    /// The fleet's table when there is a fleet (`FleetLuaShared`).
    var shared: (any LuaSharedStore)? { worker.fleet }

    func refusal(host: String, port: Int) -> String? {
        guard let admin, admin.port == port else { return nil }
        let loopback = host == "localhost" || host == "::1" || host.hasPrefix("127.")
        let wildcard = admin.host.isEmpty || admin.host == "0.0.0.0" || admin.host == "::"
        guard
            host == admin.host
                || (loopback && (wildcard || admin.host == "localhost" || admin.host.hasPrefix("127.") || admin.host == "::1"))
        else { return nil }
        return "it is this Sluice's admin listener"
    }

    private func forget(_ operation: AnyObject) { live[ObjectIdentifier(operation)] = nil }

    /// `host:port` of a listen address, the host lower case and unbracketed (empty for `:port`).
    private static func split(_ address: String) -> (host: String, port: Int)? {
        guard let colon = address.lastIndex(of: ":"), let port = Int(address[address.index(after: colon)...]) else {
            return nil
        }
        var host = address[..<colon]
        if host.hasPrefix("["), host.hasSuffix("]") { host = host.dropFirst().dropLast() }
        return (host.lowercased(), port)
    }

    private static func loopbackURL(_ address: String) -> String? {
        guard let (host, port) = split(address) else { return nil }
        switch host {
        case "", "0.0.0.0": return "http://127.0.0.1:\(port)"
        case "::": return "http://[::1]:\(port)"
        default: return host.contains(":") ? "http://[\(host)]:\(port)" : "http://\(host):\(port)"
        }
    }

    /// One sub-request: its fetch until it answers or is cancelled.
    private final class Operation: LuaOperation {
        private unowned let host: WorkerLuaHost
        var fetch: SideFetch?
        var fields: [(name: String, value: String)] = []
        var completion: ((Result<LuaSubresponse, LuaOperationError>) -> Void)?

        init(host: WorkerLuaHost) { self.host = host }

        /// Answers at once (the sub-request was not sent); `LuaWait` holds the answer until
        /// the coroutine has yielded.
        func answer(_ result: Result<LuaSubresponse, LuaOperationError>) -> Operation {
            let completion = completion
            self.completion = nil
            completion?(result)
            return self
        }

        func fetched(_ result: Result<(status: Int, body: [UInt8]), ProxyError>) {
            host.forget(self)
            fetch = nil
            let completion = completion
            self.completion = nil
            switch result {
            case .success(let response):
                completion?(
                    .success(
                        LuaSubresponse(status: response.status, headers: fields.map { ($0.name, $0.value) }, body: response.body))
                )
            case .failure(let error):
                completion?(.failure(LuaOperationError(error.message)))
            }
        }

        func cancel() {
            host.forget(self)
            completion = nil
            fetch?.cancel()
            fetch = nil
        }
    }

    /// A call's wall-clock timer.
    private final class Timer: LuaOperation {
        private unowned let host: WorkerLuaHost
        var event: LoopTimer<Timer>?
        private var fired: (() -> Void)?

        init(host: WorkerLuaHost, fired: @escaping () -> Void) {
            self.host = host
            self.fired = fired
        }

        func fire() {
            host.forget(self)
            event = nil
            let fired = fired
            self.fired = nil
            fired?()
        }

        func cancel() {
            host.forget(self)
            event = nil
            fired = nil
        }
    }
}

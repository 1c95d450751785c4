import CCurl
import CLibEvent
import COpenSSL
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// One forwarded request over Sluice's own HTTP/1.1 client: the native transport
/// (docs/architecture.md, "Two transports"). A try resolves its origin on the worker's
/// loop (`Resolver`), checks `access.deny` on the address, takes an idle connection from the
/// worker's `NativeUpstreamPool` or opens one, writes the request head
/// (`UpstreamRequestEncoder`) and streams the body, reads the response with the strict
/// `HTTPResponseParser`, and re-frames it for the client with `ResponseEncoder` — telling its
/// delegate the same events, in the same order, as `CurlUpstreamTransfer`.
///
/// Flow control, both ways: the response is read only while the client's output holds less
/// than `outputHighWatermark` (the socket's read event is off otherwise, and the origin's
/// TCP window closes); the request body is pulled from the client only while the origin's
/// socket buffer holds less than `uploadHighWatermark`.
///
/// An https origin is reached the same way over TLS (`NativeTLSContext`): the handshake runs
/// on the loop after the TCP connect, within the connect timeout, offering HTTP/1.1 alone by
/// ALPN; the connection then carries requests like a plain one.
///
/// A connection that fails before any response byte — the origin closed a pooled
/// connection just as it was reused — is the classic race of keep-alive: an idempotent
/// request is sent once more on a new connection, whatever the retry policy (as nginx and
/// haproxy do); any other is not (RFC 9110 §9.2.2), and the try fails as a reset, which
/// `retry.methods` decides about.
///
/// A try through a peer (`fleet.cache`, `PeerHop`: `peer` given) goes to the peer's address
/// instead of the origin's — no DNS, no `access.deny` (peers are the operator's own list),
/// plain HTTP whatever the URL's scheme, on the pool's connections to that address — with the
/// request line in absolute form (the peer is a proxy too); it is never resumed.
///
/// Threading: created, driven and finished on its worker's thread only. Its timers and
/// connect event hold it unretained: `cancel()` drops them first.
final class NativeUpstreamTransfer: UpstreamTransfer {
    /// Pause reading the origin when this many response bytes wait for the client (1 MiB,
    /// as for libcurl).
    static let outputHighWatermark = CurlUpstreamTransfer.outputHighWatermark
    /// Pull request body from the client only while less than this waits for the origin
    /// (256 KiB).
    static let uploadHighWatermark = 256 * 1024
    /// The most request-body bytes moved per read from the client.
    private static let uploadReadSize = 64 * 1024

    private let pool: NativeUpstreamPool
    private let resolver: Resolver
    private let base: OpaquePointer
    private unowned(unsafe) var delegate: (any UpstreamTransferDelegate)?
    private unowned(unsafe) var bodySource: (any RequestBodySource)?
    /// The client connection's output buffer, where the response goes.
    private let output: OpaquePointer
    private var request: UpstreamRequest
    let target: RequestTarget
    private let isHead: Bool
    private let clientMinorVersion: Int
    private let deny: [IPNetwork]
    private let viaLine: [UInt8]
    private let connectTimeout: Int
    private let totalTimeout: Int?
    /// The method may be sent again on a new connection (RFC 9110 §9.2.2: idempotent).
    private let resendable: Bool
    /// The try asks an instance of the fleet (`originKey`) instead of the origin (`fleet.cache`).
    /// (A flag in the padding after `resendable`: the transfer is allocated per try.)
    private let viaPeer: Bool
    /// The pool's unit for connection limits: the origin, or the peer asked instead.
    private let originKey: UpstreamOrigin
    /// `host:port`, the name errors carry (built only for them).
    private var origin: String { viaPeer ? "\(originKey.host):\(originKey.port)" : target.authority }
    /// The TLS settings of an https try (nil for plain http).
    private var tlsContext: NativeTLSContext?
    /// The TLS session being set up over `connectingFD`.
    private var handshaking: OpaquePointer?
    /// When the current connection attempt began (µs into the try): its TCP connect and TLS
    /// handshake share `connectTimeout` from there.
    private var connectStartedAt: Int64 = 0
    private var defaultCAFile: String?

    /// The delegate's answer to `responseHeadArrived`, and what it makes of the body.
    private var disposition = ResponseDisposition()
    private var lookup: Resolver.Lookup?
    /// The resolved addresses `access.deny` allows, and the one being used.
    private var candidates: [sockaddr_storage] = []
    private var candidateIndex = 0
    /// `access.deny` refused one of the resolved addresses.
    private var someDenied = false
    private var address = sockaddr_storage()
    private var poolKey: UpstreamAddressKey
    private var waitingForConnection = false
    private var connectEvent: SocketEvent<NativeUpstreamTransfer>?
    private var connectingFD: Int32 = -1
    private var connection: UpstreamConnection?
    /// The connection came from the pool (a failure before the response may be its race).
    private var reused = false
    /// The request was sent once more on a new connection already.
    private var resent = false
    private var totalTimer: LoopTimer<NativeUpstreamTransfer>?

    /// The response parser, the pool's (`ResponseParserSlot`), read and changed in place.
    private let parsing: ResponseParserSlot
    private var parser: HTTPResponseParser {
        _read { yield parsing.parser }
        _modify { yield &parsing.parser }
    }
    private var uploadRemaining: Int64 = 0
    private var uploadDone = true
    private(set) var uploadPaused = false
    /// The origin stopped taking the request body (it answered early and closed): what is
    /// left of the body is not sent.
    private var uploadBroken = false
    /// The origin closed the connection (or it failed) while the client's output was full:
    /// what was read is delivered first, then the end is judged (`connectionEnded`).
    private var peerClosed = false
    private var chunkScratch: UnsafeMutableRawPointer?

    private(set) var headSent = false
    var responseStarted: Bool { (headSent && !disposition.withholds && !invalidResponse) || continuing != nil }
    private var framing: ResponseEncoder.Framing = .none
    var framedByClose: Bool { (continuing ?? framing) == .close }
    private(set) var downloadPaused = false
    private var finished = false
    private var inCompletion = false
    private var invalidResponse = false
    var cacheFill: CacheFill?
    var extraHeadLines: [UInt8] = []
    var continuing: ResponseEncoder.Framing?
    private(set) var bodyBytesSent: Int64 = 0
    var clientFraming: ResponseEncoder.Framing { continuing ?? framing }
    private(set) var deadlineExceeded = false
    private var perTryTimeout = 0
    var resumableTry: (request: UpstreamRequest, route: UpstreamRoute)? {
        request.method == "GET" && !viaPeer ? (request, .native(perTryTimeout: perTryTimeout)) : nil
    }
    /// The response goes on into the cache's tee only (`detach`).
    private var detached = false
    var forwardedHead: UpstreamResponseHead? { responseStarted ? UpstreamResponseHead(collected: parser.head) : nil }

    /// Microseconds on the monotonic clock: the try's start, and each phase's end.
    private var startedAt: Int64 = 0
    private var timings = TryTimings()

    init(
        pool: NativeUpstreamPool, resolver: Resolver, delegate: UpstreamTransferDelegate, bodySource: RequestBodySource,
        output: OpaquePointer, request: UpstreamRequest, clientMinorVersion: Int, config: ServerConfiguration,
        viaLine: [UInt8], peer: UpstreamOrigin? = nil
    ) {
        self.pool = pool
        self.resolver = resolver
        base = pool.base
        self.delegate = delegate
        self.bodySource = request.body == .none ? nil : bodySource
        self.output = output
        self.request = request
        target = request.target
        isHead = request.isHead
        self.clientMinorVersion = clientMinorVersion
        deny = config.access.deny
        defaultCAFile = config.tls.caFile
        self.viaLine = viaLine
        connectTimeout = config.timeouts.upstreamConnect
        totalTimeout = request.totalTimeout ?? config.timeouts.total
        resendable = RetryPolicy.isDefaultRetryable(request.method)
        if let peer {
            viaPeer = true
            originKey = peer
        } else {
            viaPeer = false
            originKey = UpstreamOrigin(host: request.target.host, port: request.target.port)
        }
        parsing = pool.takeParser()
        // A recycled parser still holds its last response: nothing of it may show in this
        // try's timings (`currentTimings` reads the status).
        parsing.parser.expectResponse(headRequest: isHead)
        poolKey = UpstreamAddressKey(origin: originKey)
        timings.engine = .native
    }

    deinit {
        chunkScratch?.deallocate()
        parsing.stopHeadTimer()
        parsing.transfer = nil
        pool.recycle(parsing)
    }

    // MARK: UpstreamTransfer

    func start(perTryTimeout: Int) {
        self.perTryTimeout = perTryTimeout
        startedAt = Self.microseconds()
        parsing.armHeadTimer(on: base, for: self, milliseconds: perTryTimeout)
        if target.scheme == .https, !viaPeer {
            switch pool.tlsContexts.context(
                trust: request.trust, clientCertificate: request.clientCertificate, defaultCAFile: defaultCAFile)
            {
            case .success(let context):
                tlsContext = context
            case .failure(let failure):
                let error: ProxyError =
                    failure.isTrust
                    ? .trustFailure(host: origin, evaluator: request.trust.evaluatorName, reason: failure.text)
                    : .tlsFailure(host: origin, reason: failure.text)
                fail(error, kind: .other)
                return
            }
        }
        if let totalTimeout, totalTimeout > 0 {
            let totalTimer = LoopTimer(on: base, owner: self) { t in
                t.deadlineExceeded = true
                t.fail(.upstreamTimeout(host: t.origin, phase: t.connection == nil ? .connect : .transfer), kind: .timeout)
            }
            totalTimer.arm(milliseconds: totalTimeout)
            self.totalTimer = totalTimer
        }
        if let addresses = resolver.cached(host: originKey.host, port: originKey.port) {
            resolved(addresses, atStart: true)
            return
        }
        lookup = resolver.resolve(host: originKey.host, port: originKey.port) { [weak self] result in
            guard let self, !self.finished else { return }
            self.lookup = nil
            switch result {
            case .success(let addresses): self.resolved(addresses, atStart: false)
            case .failure(let failure):
                Log.debug("upstream \(self.origin): \(failure.reason)")
                self.fail(.dnsFailure(host: self.target.host), kind: .dns)
            }
        }
    }

    /// The per-try timeout passed without a response head (`ResponseParserSlot`'s timer).
    func headTimedOut() {
        fail(.upstreamTimeout(host: origin, phase: .noResponseHead), kind: .timeout)
    }

    func cancel() {
        guard !finished else { return }
        if let delegate, !inCompletion, continuing == nil { delegate.tryEnded(timings: currentTimings()) }
        finished = true
        parsing.stopHeadTimer()
        totalTimer = nil
        lookup?.cancel()
        lookup = nil
        if connectEvent != nil {
            connectEvent = nil
            if let handshaking {
                SSL_free(handshaking)
                self.handshaking = nil
            }
            Glibc.close(connectingFD)
            pool.release(nil, origin: originKey, reusable: false)
        }
        if waitingForConnection { pool.cancelWait(origin: originKey, for: self) }
        if let connection {
            // Abandoned midway (the client left, an operator cancelled): the origin is told
            // by a reset, whatever it was doing. A try that failed closes it plainly.
            self.connection = nil
            pool.release(connection, origin: originKey, reusable: false, abortive: !inCompletion)
        }
        disposition.redirectTo = nil
        delegate = nil
        bodySource = nil
    }

    func forward(keepAlive: Bool) { disposition.answer = .forward(keepAlive: keepAlive) }
    func follow(_ next: UpstreamRequest) { disposition.answer = .follow(next) }
    func discard() { disposition.answer = .discard }
    func absorb() { disposition.answer = .absorb }
    func refuse(_ error: ProxyError) { disposition.answer = .refuse(ResponseDisposition.Refusal(error)) }
    func collect(limit: Int) { disposition.answer = .collect(limit: limit) }
    func replaceHead(_ head: ResponseHeadCollector) { parser.replaceHead(head) }

    func detach(to delegate: any UpstreamTransferDelegate) {
        self.delegate = delegate
        detached = true
        resumeDownload()
    }

    func resumeDownload() {
        guard downloadPaused, !finished, let connection else { return }
        downloadPaused = false
        connection.socket.wantsInput = true
        readResponse()
        if peerClosed, !downloadPaused { connectionEnded() }
    }

    func resumeUpload() {
        guard uploadPaused, !finished else { return }
        uploadPaused = false
        sendBody()
    }

    // MARK: resolving and connecting

    /// `atStart`: the addresses were cached, handed over inside `start`, when no time has passed
    /// that a lookup took (`dns` stays 0, and a reused connection's `connect` with it: two
    /// clock reads fewer on nearly every try).
    private func resolved(_ addresses: Resolver.Addresses, atStart: Bool) {
        if !atStart { timings.dns = elapsed() }
        // `access.deny` is checked on every address, as libcurl's open-socket callback did;
        // the allowed ones are tried in order (IPv4 first) until one accepts.
        candidates = viaPeer ? addresses.list : Self.allowed(addresses.list, deny: deny)
        someDenied = candidates.count < addresses.list.count
        guard !candidates.isEmpty else {
            fail(.destinationDenied(host: target.host), kind: .other)
            return
        }
        use(candidate: 0)
        acquireConnection(atStart: atStart)
    }

    /// The addresses of `list` that no network of `deny` holds, in order. Nearly always none
    /// is denied: then `list` itself, not a filtered copy (an allocation per try).
    static func allowed(_ list: [sockaddr_storage], deny: [IPNetwork]) -> [sockaddr_storage] {
        let denied = { (candidate: sockaddr_storage) -> Bool in
            var a = candidate
            return withUnsafePointer(to: &a) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { SocketAddress.matches($0, deny) }
            }
        }
        return list.contains(where: denied) ? list.filter { !denied($0) } : list
    }

    private func use(candidate index: Int) {
        candidateIndex = index
        address = candidates[index]
        poolKey = UpstreamAddressKey(
            origin: originKey, address: address, tls: tlsContext.map { ObjectIdentifier($0) })
    }

    /// A connect to the current address was refused: the next allowed address is tried (in
    /// the place the failed one had under the limit), or the try fails.
    private func connectRefused() {
        guard candidateIndex + 1 < candidates.count else {
            pool.release(nil, origin: originKey, reusable: false)
            // As libcurl reported it: an address `access.deny` refused outweighs a refusal.
            if someDenied {
                fail(.destinationDenied(host: target.host), kind: .other)
            } else {
                fail(.upstreamRefused(host: origin), kind: .refused)
            }
            return
        }
        use(candidate: candidateIndex + 1)
        openConnection()
    }

    private func acquireConnection(atStart: Bool) {
        switch pool.acquire(origin: originKey, key: poolKey, for: self) {
        case .reuse(let connection):
            self.connection = connection
            reused = true
            timings.connect = atStart ? 0 : elapsed()
            sendRequest()
        case .open:
            openConnection()
        case .wait:
            waitingForConnection = true
        }
    }

    /// The pool let a waiting try go on: with a new connection of its own (`opening`), or
    /// to take the one that just went idle.
    func connectionAvailable(opening: Bool) {
        waitingForConnection = false
        guard !finished else {
            if opening { pool.release(nil, origin: originKey, reusable: false) }
            return
        }
        if opening { openConnection() } else { acquireConnection(atStart: false) }
    }

    private func openConnection() {
        connectStartedAt = elapsed()
        let family = Int32(address.ss_family)
        let fd = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else {
            pool.release(nil, origin: originKey, reusable: false)
            fail(.socketUnavailable(host: origin, reason: CurlUpstreamTransfer.socketFailure(errno)), kind: .other)
            return
        }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        let length = socklen_t(family == AF_INET6 ? MemoryLayout<sockaddr_in6>.size : MemoryLayout<sockaddr_in>.size)
        let r = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, length) }
        }
        if r == 0 {
            connected(fd)
            return
        }
        guard errno == EINPROGRESS else {
            let code = errno
            Glibc.close(fd)
            Log.debug("upstream \(origin): connect failed: \(String(cString: strerror(code)))")
            connectRefused()
            return
        }
        connectingFD = fd
        let event = SocketEvent(on: base, fd: fd, .write, persistent: false, owner: self) { t, timedOut in
            t.connectFinished(timedOut: timedOut)
        }
        event.arm(timeoutMilliseconds: connectTimeout)
        connectEvent = event
    }

    private func connectFinished(timedOut: Bool) {
        let fd = connectingFD
        connectEvent = nil
        connectingFD = -1
        var error: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        if !timedOut { getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) }
        guard !timedOut, error == 0 else {
            Glibc.close(fd)
            if timedOut {
                pool.release(nil, origin: originKey, reusable: false)
                fail(.upstreamTimeout(host: origin, phase: .connect), kind: .timeout)
            } else {
                Log.debug("upstream \(origin): connect failed: \(String(cString: strerror(error)))")
                connectRefused()
            }
            return
        }
        connected(fd)
    }

    private func connected(_ fd: Int32) {
        timings.connect = elapsed()
        timings.newConnection = true
        if let tlsContext {
            guard let ssl = tlsContext.makeSSL(fd: fd, host: target.host) else {
                Glibc.close(fd)
                pool.release(nil, origin: originKey, reusable: false)
                fail(.tlsFailure(host: origin, reason: NativeTLS.errorString()), kind: .tls)
                return
            }
            connectingFD = fd
            handshaking = ssl
            continueHandshake()
            return
        }
        established(fd, tls: nil)
    }

    /// Drives the TLS handshake one step: done, or waiting for the socket (within what is
    /// left of the connect timeout), or failed — named by the trust evaluator when the
    /// certificate was refused.
    private func continueHandshake() {
        guard let ssl = handshaking else { return }
        let fd = connectingFD
        ERR_clear_error()  // SSL_get_error reads the thread's queue (libcurl's leftovers too)
        let r = SSL_connect(ssl)
        if r == 1 {
            handshaking = nil
            connectingFD = -1
            timings.tls = elapsed()
            if let tlsContext, tlsContext.checksHostAfterHandshake, !tlsContext.peerNames(ssl, host: target.host) {
                handshakeFailed(
                    ssl, fd,
                    .trustFailure(host: origin, evaluator: request.trust.evaluatorName, reason: "hostname mismatch"),
                    kind: .other)
                return
            }
            established(fd, tls: ssl)
            return
        }
        let error = SSL_get_error(ssl, r)
        if error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE {
            ERR_clear_error()
            let left = connectTimeout - Int((elapsed() - connectStartedAt) / 1000)
            guard left > 0 else {
                handshakeFailed(ssl, fd, .upstreamTimeout(host: origin, phase: .connect), kind: .timeout)
                return
            }
            // A new event for the direction OpenSSL waits for (the one before it, possibly
            // running now, is dropped).
            let event = SocketEvent(
                on: base, fd: fd, error == SSL_ERROR_WANT_READ ? .read : .write, persistent: false, owner: self
            ) { t, timedOut in t.handshakeReady(timedOut: timedOut) }
            event.arm(timeoutMilliseconds: left)
            connectEvent = event
            return
        }
        let verify = Int32(SSL_get_verify_result(ssl))
        let failure: ProxyError
        let kind: TransportErrorKind
        // Under `disabled` (no verification) OpenSSL still records a verify result: it never
        // explains a failure there.
        if verify != X509_V_OK, !request.trust.requirements.insecure {
            ERR_clear_error()
            failure = .trustFailure(
                host: origin, evaluator: request.trust.evaluatorName,
                reason: UpstreamTLS.verifyReason(verify, message: "", requirements: request.trust.requirements))
            kind = .other
        } else {
            let detail =
                error == SSL_ERROR_SYSCALL && ERR_peek_error() == 0
                ? "connection lost during the TLS handshake" : NativeTLS.errorString()
            ERR_clear_error()
            failure = .tlsFailure(host: origin, reason: detail)
            kind = .tls
        }
        handshakeFailed(ssl, fd, failure, kind: kind)
    }

    private func handshakeReady(timedOut: Bool) {
        if timedOut, let ssl = handshaking {
            handshakeFailed(ssl, connectingFD, .upstreamTimeout(host: origin, phase: .connect), kind: .timeout)
            return
        }
        continueHandshake()
    }

    private func handshakeFailed(_ ssl: OpaquePointer, _ fd: Int32, _ error: ProxyError, kind: TransportErrorKind) {
        connectEvent = nil
        handshaking = nil
        connectingFD = -1
        SSL_free(ssl)
        Glibc.close(fd)
        pool.release(nil, origin: originKey, reusable: false)
        Log.debug("upstream \(origin): TLS handshake failed: \(error.message)")
        fail(error, kind: kind)
    }

    /// The connection is ready for requests (after the TLS handshake for https).
    private func established(_ fd: Int32, tls: OpaquePointer?) {
        connectEvent = nil
        let connection = UpstreamConnection(key: poolKey, fd: fd, pool: pool, tls: tls, tlsContext: tlsContext)
        connection.user = self
        self.connection = connection
        sendRequest()
    }

    // MARK: the request

    private func sendRequest() {
        guard let connection else { return }
        parser.expectResponse(headRequest: isHead)
        UpstreamRequestEncoder.writeHead(&request, into: connection.socket.output, absoluteForm: viaPeer)
        switch request.body {
        case .none:
            uploadDone = true
        case .length(let n):
            uploadRemaining = n
            uploadDone = n == 0
        case .streamed:
            uploadDone = false
        }
        uploadBroken = false
        uploadPaused = false
        peerClosed = false
        if uploadDone { flush(connection) } else { sendBody() }
        // A response (or the origin's close) that arrived while the connection was idle in
        // the pool would have closed it there: nothing waits in the input now.
    }

    /// Moves request body from the client into the origin's output, up to the watermark.
    private func fillBody(_ connection: UpstreamConnection) {
        guard !uploadDone, !uploadBroken, let bodySource else { return }
        let out = connection.socket.output
        while evbuffer_get_length(out) < Self.uploadHighWatermark {
            let n: Int?
            do {
                switch request.body {
                case .length:
                    let want = Int(min(uploadRemaining, Int64(Self.uploadReadSize)))
                    var vec = iovec()
                    guard evbuffer_reserve_space(out, want, &vec, 1) >= 1 else { return }
                    n = try bodySource.readRequestBody(into: vec.iov_base, capacity: min(want, vec.iov_len))
                    vec.iov_len = n ?? 0
                    evbuffer_commit_space(out, &vec, 1)
                    if let n { uploadRemaining -= Int64(n) }
                    if n == 0 {
                        uploadDone = true
                    } else if uploadRemaining <= 0 {
                        // One more read, which returns 0: the client's body parser reports
                        // its end there, and the client connection learns the request was
                        // read whole (so its response may keep the connection open).
                        var sink: UInt8 = 0
                        _ = try bodySource.readRequestBody(into: &sink, capacity: 1)
                        uploadDone = true
                    }
                default:
                    if chunkScratch == nil { chunkScratch = .allocate(byteCount: Self.uploadReadSize, alignment: 16) }
                    n = try bodySource.readRequestBody(into: chunkScratch!, capacity: Self.uploadReadSize)
                    if let n, n > 0 {
                        ResponseEncoder.chunk(UnsafeRawBufferPointer(start: chunkScratch, count: n), into: out)
                    } else if n == 0 {
                        ResponseEncoder.lastChunk(into: out)
                        uploadDone = true
                    }
                }
            } catch {
                fail(error, kind: .other)
                return
            }
            if n == nil {
                uploadPaused = true
                return
            }
            if uploadDone { return }
        }
    }

    /// Fills and writes until the client has no more body for now, the body ended, or the
    /// origin's socket buffer is full (its write event then calls `upstreamDrained`).
    private func sendBody() {
        while !finished, let connection {
            fillBody(connection)
            flush(connection)
            guard !finished, !uploadDone, !uploadPaused, !uploadBroken,
                evbuffer_get_length(connection.socket.output) == 0
            else { return }
        }
    }

    private func flush(_ connection: UpstreamConnection) {
        guard !finished, !connection.socket.flush() else { return }
        // The origin stopped reading (it answered early and closed, or reset): the rest of
        // the body is dropped, and the response — if one comes — is read to its end.
        uploadBroken = true
        evbuffer_drain(connection.socket.output, evbuffer_get_length(connection.socket.output))
    }

    // MARK: socket events (from `UpstreamConnection`)

    func upstreamReadable() { readResponse() }

    func upstreamDrained() {
        if !uploadDone && !uploadPaused { sendBody() }
    }

    func upstreamClosed() {
        peerClosed = true
        readResponse()
        if !downloadPaused { connectionEnded() }
    }

    /// The origin's side ended and everything it sent was read: a close-delimited body
    /// ends here; anything else was cut short, or never started.
    private func connectionEnded() {
        guard !finished, let connection else { return }
        if connection.socket.endedWithError, parser.hasStarted {
            // A reset — or a TLS session ended without close_notify, which may be a cut — is
            // never the end of a close-delimited body.
            let reason =
                connection.socket.tlsEndedUncleanly
                ? "TLS connection closed without close_notify during the response" : "connection reset during the response"
            fail(.upstreamProtocol(host: origin, reason: reason), kind: .other)
            return
        }
        do {
            if case .end? = try parser.finish() {
                responseEnded(connectionReusable: false)
            } else {
                closedBeforeResponse()
            }
        } catch {
            fail(.upstreamProtocol(host: origin, reason: error.reason), kind: parser.hasStarted ? .other : .reset)
        }
    }

    // MARK: the response

    /// Parses what the origin sent and acts on each event, until the input runs out, the
    /// client's output is full, or the response ends.
    private func readResponse() {
        while !finished, !downloadPaused, let connection {
            let input = connection.socket.input
            var iov = iovec()
            let available = evbuffer_peek(input, -1, nil, &iov, 1) > 0 ? iov.iov_len : 0
            let buffer = UnsafeRawBufferPointer(start: available > 0 ? iov.iov_base : nil, count: available)
            let consumed: Int
            let event: HTTPResponseParser.Event?
            do {
                (consumed, event) = try parser.parse(buffer)
            } catch {
                fail(.upstreamProtocol(host: origin, reason: "invalid response: \(error.reason)"), kind: .other)
                return
            }
            switch event {
            case .head?:
                timings.firstByte = elapsed()
                parsing.stopHeadTimer()
                responseHead()
            case .body(let range)?:
                if timings.firstByte == 0 { timings.firstByte = elapsed() }
                if range.lowerBound == 0, range.count == consumed, framing == .length || framing == .close,
                    !disposition.withholds
                {
                    // The body goes on unchanged: its chain moves from the origin's input to the
                    // client's output without a copy (after the cache's tee saw it).
                    deliver(UnsafeRawBufferPointer(rebasing: buffer[range]), movingFrom: input)
                    connection.socket.inputConsumed()
                    continue
                }
                deliver(UnsafeRawBufferPointer(rebasing: buffer[range]))
            case .end?:
                evbuffer_drain(input, consumed)
                responseEnded(
                    connectionReusable: parser.keepAlive && uploadDone && !uploadBroken
                        && evbuffer_get_length(input) == 0 && !connection.socket.tlsEnded
                        && !(tlsContext != nil && request.reuse.forbidReuse))
                return
            case .interim(let status)?:
                // Mid-body (a resumed download), an interim head has nowhere to go.
                if continuing == nil { delegate?.interimResponse(status: status, fields: parser.head.endToEndFields()) }
            case nil:
                break
            }
            // The event may have ended the try (a head refused, a continuation refused): the
            // connection and its buffers are gone.
            guard !finished else { return }
            if consumed > 0 {
                evbuffer_drain(input, consumed)
                connection.socket.inputConsumed()
            }
            if consumed == 0 && event == nil { return }
        }
    }

    private func responseHead() {
        guard !headSent, let delegate else { return }
        headSent = true
        if let continuing {
            guard delegate.continuationArrived(UpstreamResponseHead(collected: parser.head)) else {
                return fail(.upstreamProtocol(host: origin, reason: "the resume was refused"), kind: .other)
            }
            framing = continuing
            return
        }
        disposition.answer = nil
        delegate.responseHeadArrived(UpstreamResponseHead(collected: parser.head), on: self)
        guard !finished else { return }
        settleAnswer(delegate)
    }

    /// Acts on the delegate's answer about the head (`disposition`): true when the head went
    /// to the client, so that the body follows it.
    @discardableResult
    private func settleAnswer(_ delegate: any UpstreamTransferDelegate) -> Bool {
        guard let keepAlive = disposition.settle() else {
            if let refusal = disposition.refused {
                // Nothing reached the client: the exchange fails with the refusal's error.
                headSent = false
                invalidResponse = true
                fail(refusal.error, kind: .other)
            }
            return false
        }
        do {
            framing = try parsing.parser.encodeForwardedHead(
                isHeadRequest: isHead, clientMinorVersion: clientMinorVersion,
                keepAlive: keepAlive, viaLine: viaLine, extraLines: extraHeadLines, into: output)
        } catch {
            // Nothing reached the client: the exchange fails with 502.
            headSent = false
            invalidResponse = true
            fail(.upstreamProtocol(host: origin, reason: "invalid response head: \(error.reason)"), kind: .other)
            return false
        }
        delegate.responseStarted(status: parser.head.status)
        return true
    }

    /// A kept body (`collect`) passed its limit: the delegate answers as for a head, and a
    /// response that goes to the client after all gets the body kept so far, then the rest.
    private func collectionOverflowed(_ collector: ResponseDisposition.Collector) {
        guard let delegate else { return }
        disposition.collector = nil
        disposition.answer = nil
        delegate.collectionOverflowed(UpstreamResponseHead(collected: parser.head), on: self)
        guard !finished, settleAnswer(delegate) else { return }
        collector.body.withUnsafeBytes { deliver($0) }
    }

    /// Sends body bytes to the client, re-framed. `movingFrom`: `data` is the head of that
    /// buffer, and (for a body the client gets as it comes: `.length`, `.close`) is moved from
    /// it instead of copied; the caller then must not drain it.
    private func deliver(_ data: UnsafeRawBufferPointer, movingFrom source: OpaquePointer? = nil) {
        if detached {
            // The client reads the fill (or left): the body goes to the tee alone.
            cacheFill?.append(data)
            if let source { evbuffer_drain(source, data.count) }
            bodyBytesSent += Int64(data.count)
            return
        }
        if let collector = disposition.collector {
            // Kept for a script (`collect`): nothing reaches the client yet.
            let fits = collector.append(data)
            if let source { evbuffer_drain(source, data.count) }
            if !fits { collectionOverflowed(collector) }
            return
        }
        guard let delegate, !disposition.drains, data.count > 0 else {
            if let source { evbuffer_drain(source, data.count) }
            return
        }
        switch framing {
        case .none:
            // A body on a bodiless response is dropped, never forwarded.
            if let source { evbuffer_drain(source, data.count) }
            return
        case .chunked:
            cacheFill?.append(data)
            ResponseEncoder.chunk(data, into: output)
            if let source { evbuffer_drain(source, data.count) }
        case .length, .close:
            cacheFill?.append(data)
            if let source {
                evbuffer_remove_buffer(source, output, data.count)
            } else {
                evbuffer_add(output, data.baseAddress, data.count)
            }
        }
        bodyBytesSent += Int64(data.count)
        delegate.responseBodySent(bytes: data.count)
        if evbuffer_get_length(output) > Self.outputHighWatermark, let connection {
            if cacheFill?.sharesItsBody == true, delegate.clientFellBehind(self) { return }
            downloadPaused = true
            connection.socket.wantsInput = false
        }
    }

    /// The response is complete: the connection goes back to the pool (if it may), and the
    /// exchange is told as the disposition says.
    private func responseEnded(connectionReusable: Bool) {
        guard !finished, let delegate else { return }
        inCompletion = true
        if continuing == nil { delegate.tryEnded(timings: currentTimings()) }
        if let connection {
            self.connection = nil
            pool.release(connection, origin: originKey, reusable: connectionReusable)
        }
        if let next = disposition.redirectTo {
            disposition.redirectTo = nil
            cancel()
            delegate.transferRedirected(to: next)
            return
        }
        if disposition.discarding {
            cancel()
            if disposition.absorbing { delegate.transferAbsorbed() } else { delegate.transferDiscarded() }
            return
        }
        if let collector = disposition.collector {
            let head = UpstreamResponseHead(collected: parser.head)
            cancel()
            delegate.transferCollected(head, body: collector.body)
            return
        }
        if framing == .chunked, !detached { ResponseEncoder.lastChunk(into: output) }
        let reusable = framing != .close
        cancel()
        delegate.transferFinished(reusable: reusable)
    }

    /// The connection ended before any byte of a response.
    private func closedBeforeResponse() {
        guard let connection else { return }
        if reused, !resent, resendable, request.body == .none || bodySource?.rewindRequestBody() == true {
            // The keep-alive race: the origin closed the pooled connection as it was reused.
            Log.debug(
                "upstream \(origin): pooled connection closed before a response; sending the \(request.method) again on a new connection"
            )
            resent = true
            reused = false
            self.connection = nil
            pool.discardKeepingSlot(connection)
            openConnection()
            return
        }
        if reused, !resendable {
            fail(
                .upstreamProtocol(
                    host: origin, reason: "connection lost before a response (a \(request.method) is not sent twice)"),
                kind: .reset)
            return
        }
        fail(.upstreamProtocol(host: origin, reason: "connection closed before a response"), kind: .reset)
    }

    /// Ends the try with `error`: the client gets it (through the exchange's retry
    /// decision) when no response byte reached it, else its connection is cut.
    private func fail(_ error: ProxyError, kind: TransportErrorKind) {
        guard !finished, let delegate else { return }
        inCompletion = true
        if continuing == nil { delegate.tryEnded(timings: currentTimings()) }
        let sent = (headSent && !disposition.withholds && !invalidResponse) || continuing != nil
        disposition.redirectTo = nil
        cancel()
        if sent {
            Log.debug("upstream \(origin) failed mid-response: \(error.message)")
            delegate.transferAborted()
        } else {
            delegate.transferFailed(error, kind: kind)
        }
    }

    // MARK: timings

    private func currentTimings() -> TryTimings {
        var t = timings
        t.total = elapsed()
        if headSent || parser.head.status != 0 { t.httpVersion = parser.minorVersion == 0 ? .http1_0 : .http1_1 }
        return t
    }

    private func elapsed() -> Int64 { Self.microseconds() - startedAt }

    private static func microseconds() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec) / 1000
    }
}

extension HTTPResponseParser {
    /// `ResponseEncoder.forwardedHead` of the head parsed, read where it lies: through the
    /// transfer's `parser` accessor, `parser.head` was copied for the call and destroyed
    /// after it (its four arrays retained and released, ~250 instructions a response).
    fileprivate mutating func encodeForwardedHead(
        isHeadRequest: Bool, clientMinorVersion: Int, keepAlive: Bool, viaLine: [UInt8], extraLines: [UInt8],
        into output: OpaquePointer
    ) throws(ResponseEncoder.InvalidResponse) -> ResponseEncoder.Framing {
        try ResponseEncoder.forwardedHead(
            head, isHeadRequest: isHeadRequest, clientMinorVersion: clientMinorVersion, keepAlive: keepAlive,
            viaLine: viaLine, extraLines: extraLines, into: output)
    }
}

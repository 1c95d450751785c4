import CCurl
import CLibEvent
import CShims
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// Something that owns a curl easy handle on a worker's multi and wants its result.
/// The handle's `CURLOPT_PRIVATE` points at the owner (unretained: the owner keeps itself
/// alive until `curlDone` or its own cancellation detaches the handle).
class CurlTransfer {
    func curlDone(_ result: CURLcode) {}
}

/// One forwarded request: a curl easy handle on the worker's `UpstreamSession`, with the
/// request head translated for curl, the response head translated back for the client, and
/// the body streamed both ways with backpressure (`CURL_WRITEFUNC_PAUSE` when the client's
/// output buffer passes its high watermark, `CURL_READFUNC_PAUSE` when the client has not
/// sent more body yet).
///
/// Threading: created, driven and finished on its worker's thread only.
final class CurlUpstreamTransfer: CurlTransfer, UpstreamTransfer {
    /// Pause the upstream when this many response bytes wait for the client (1 MiB).
    static let outputHighWatermark = 1 << 20
    /// libcurl's receive and upload buffers (64 KiB; its default is 16 KiB). Larger buffers
    /// stream large bodies faster (256 KiB: ~10 % in a 1 GiB download measured here), but a pooled handle keeps its
    /// buffer, and its touched pages count for as long as it is pooled.
    static let receiveBufferSize = 64 * 1024

    private let session: UpstreamSession
    /// The client side. Not retained and not weak (no reference counting per callback): the
    /// connection owns this transfer and detaches it with `cancel()` before going away, and
    /// `cancel()` sets this to nil.
    private unowned(unsafe) var delegate: (any UpstreamTransferDelegate)?
    /// The request body, for a request that has one; the same lifetime rule as `delegate`.
    private unowned(unsafe) var bodySource: (any RequestBodySource)?
    /// The client connection's output buffer, where the response goes (lives as long as the
    /// connection, which outlives this transfer's attachment to it).
    private let output: OpaquePointer
    /// The delegate's answer to `responseHeadArrived`, and what it makes of the body.
    private var disposition = ResponseDisposition()
    private let handle: UnsafeMutableRawPointer
    /// A plain request: http, no request body, no credentials. Its handle goes back to the
    /// pool configured (`UpstreamSession.finish`), and a configured handle from the pool
    /// needs only the options that differ between plain requests.
    private let isPlain: Bool
    /// The handle came configured by an earlier plain request.
    private let handleConfigured: Bool
    /// The request's header lines as curl reads them, made when the request is handed to
    /// curl and kept while libcurl may read them (until `cancel()`).
    private var requestHeaders: CurlHeaderList?
    private let errorBuffer: UnsafeMutablePointer<CChar>
    private var tryTimer: LoopTimer<CurlUpstreamTransfer>?
    let target: RequestTarget
    private let isHead: Bool
    private let clientMinorVersion: Int
    private let deny: [IPNetwork]
    /// `Via: …\r\n` for the response head (the worker's).
    private let viaLine: [UInt8]
    private let trust: ServerTrust
    /// The parent proxy the transfer goes through, if any (its failures are named as its).
    private var parentProxy: UpstreamProxy?
    /// Sent as HTTP/2 with prior knowledge (h2c): a stream of a shared connection.
    private var priorKnowledge = false

    /// The response head as libcurl delivers it; its storage comes from the session's pool
    /// and goes back when the transfer is freed (`deinit`: the exchange may still read the
    /// head after `cancel()`).
    private var head: ResponseHeadCollector
    private var status: Int { head.status }
    private(set) var headSent = false
    /// Response bytes reached the client's output (a drained redirect or retry sends none).
    var responseStarted: Bool { (headSent && !disposition.withholds && !invalidResponse) || continuing != nil }
    private var framing: ResponseEncoder.Framing = .none
    /// The client's response is framed by the end of the connection (an HTTP/1.0 client and
    /// an upstream body without a length): only the kind of close tells a cut from the end.
    var framedByClose: Bool { (continuing ?? framing) == .close }
    private(set) var downloadPaused = false
    private(set) var uploadPaused = false
    private var pendingError: ProxyError?
    /// How `pendingError` counts for the retry policy.
    private var pendingKind = TransportErrorKind.other
    /// The method may be sent again by libcurl itself (RFC 9110 §9.2.2: idempotent).
    private let resendable: Bool
    private let method: String
    /// How often libcurl was about to send the request, and whether response bytes came since
    /// the last time (see `onPrerequest`).
    private var requestsSent = 0
    private var responseSinceRequest = false
    private var finished = false
    /// Keeps a copy of the body sent to the client, for the shared cache (set by the
    /// delegate while it answers `responseHeadArrived`; nil without a cache).
    var cacheFill: CacheFill?
    /// Field lines (each ending in CRLF) added to the forwarded head after `Via`: the
    /// cache's `Cache-Status`. Empty without a cache.
    var extraHeadLines: [UInt8] = []
    var continuing: ResponseEncoder.Framing?
    private(set) var bodyBytesSent: Int64 = 0
    var clientFraming: ResponseEncoder.Framing { continuing ?? framing }
    /// `CURLOPT_TIMEOUT_MS` is `timeouts.total`: libcurl's timeout is the deadline.
    private(set) var deadlineExceeded = false
    /// A `GET`'s request, kept for a resume (`resumableTry`).
    private var getRequest: UpstreamRequest?
    private var perTryTimeout = 0
    var resumableTry: (request: UpstreamRequest, route: UpstreamRoute)? {
        getRequest.map { ($0, .curl(perTryTimeout: perTryTimeout)) }
    }
    /// The response goes on into the cache's tee only (`detach`).
    private var detached = false
    var forwardedHead: UpstreamResponseHead? { responseStarted ? UpstreamResponseHead(collected: head) : nil }
    /// The upstream's head was refused (see `ResponseEncoder.forwardedHead`).
    private var invalidResponse = false
    /// True once curlDone reported the try's timings (cancel must not report them again).
    private var inCompletion = false
    /// The final head arrived (the per-try timer is stopped); it is acted on lazily, at the
    /// first body byte or at the end, because curl may still answer an auth challenge.
    private var headComplete: Bool { head.isComplete }

    init(
        session: UpstreamSession, delegate: UpstreamTransferDelegate, bodySource: RequestBodySource,
        output: OpaquePointer, request: UpstreamRequest,
        clientMinorVersion: Int, config: ServerConfiguration, viaLine: [UInt8]
    ) {
        self.session = session
        self.delegate = delegate
        self.bodySource = request.body == .none ? nil : bodySource
        self.output = output
        self.target = request.target
        self.isHead = request.isHead
        self.clientMinorVersion = clientMinorVersion
        self.deny = config.access.deny
        self.viaLine = viaLine
        head = session.takeHeadCollector()
        trust = request.trust
        method = request.method
        resendable = RetryPolicy.isDefaultRetryable(request.method)
        isPlain =
            request.target.scheme == .http && request.body == .none && request.credentials == nil
            && request.parentProxy == nil
        (handle, handleConfigured) = session.makeHandle(plain: isPlain)
        errorBuffer = .allocate(capacity: Int(CURL_ERROR_SIZE) + 1)
        errorBuffer.initialize(repeating: 0, count: Int(CURL_ERROR_SIZE) + 1)
        super.init()
        if request.method == "GET" { getRequest = request }
        configure(request, config: config)
    }

    deinit {
        errorBuffer.deallocate()
        session.recycle(&head)
    }

    // MARK: setup

    private func configure(_ request: UpstreamRequest, config: ServerConfiguration) {
        let h = handle
        let me = Unmanaged.passUnretained(self).toOpaque()
        // What differs between plain requests: set on every handle, configured or not.
        sluice_easy_setopt_ptr(h, CURLOPT_PRIVATE, me)
        sluice_easy_setopt_str(h, CURLOPT_URL, target.url)
        sluice_easy_setopt_ptr(h, CURLOPT_ERRORBUFFER, errorBuffer)
        sluice_easy_setopt_long(h, CURLOPT_TIMEOUT_MS, request.totalTimeout ?? config.timeouts.total ?? 0)
        sluice_easy_setopt_ptr(h, CURLOPT_HEADERDATA, me)
        sluice_easy_setopt_ptr(h, CURLOPT_WRITEDATA, me)
        sluice_easy_setopt_ptr(h, CURLOPT_OPENSOCKETDATA, me)
        sluice_easy_setopt_ptr(h, CURLOPT_PREREQDATA, me)
        sluice_easy_setopt_long(h, CURLOPT_NOBODY, isHead ? 1 : 0)
        if !handleConfigured {
            // What every request of this process has in common.
            sluice_easy_setopt_str(h, CURLOPT_PROTOCOLS_STR, "http,https")
            sluice_easy_setopt_long(h, CURLOPT_PATH_AS_IS, 1)
            sluice_easy_setopt_long(h, CURLOPT_BUFFERSIZE, Self.receiveBufferSize)
            sluice_easy_setopt_long(h, CURLOPT_UPLOAD_BUFFERSIZE, Self.receiveBufferSize)
            sluice_easy_setopt_long(h, CURLOPT_CONNECTTIMEOUT_MS, config.timeouts.upstreamConnect)
            sluice_easy_setopt_data_cb(h, CURLOPT_HEADERFUNCTION) { ptr, size, count, ud in
                let t = Unmanaged<CurlUpstreamTransfer>.fromOpaque(ud!).takeUnretainedValue()
                return t.onHeaderLine(UnsafeRawBufferPointer(start: ptr, count: size * count))
            }
            sluice_easy_setopt_data_cb(h, CURLOPT_WRITEFUNCTION) { ptr, size, count, ud in
                let t = Unmanaged<CurlUpstreamTransfer>.fromOpaque(ud!).takeUnretainedValue()
                return t.onBody(UnsafeRawBufferPointer(start: ptr, count: size * count))
            }
            sluice_easy_setopt_opensocket_cb(h) { clientp, purpose, address in
                let t = Unmanaged<CurlUpstreamTransfer>.fromOpaque(clientp!).takeUnretainedValue()
                return t.openSocket(address!)
            }
            sluice_easy_setopt_prereq_cb(h) { clientp, _, _, _, _ in
                Unmanaged<CurlUpstreamTransfer>.fromOpaque(clientp!).takeUnretainedValue().onPrerequest()
            }
        }
        parentProxy = request.parentProxy
        request.parentProxy?.apply(to: h)
        let choice = request.http2.protocolChoice(https: target.scheme == .https)
        priorKnowledge = choice.version == .priorKnowledge
        Self.applyProtocol(choice, to: h)
        if target.scheme == .https {
            UpstreamTLS.configure(
                h, trust: request.trust, clientCertificate: request.clientCertificate,
                defaultCAFile: config.tls.caFile)
            request.reuse.apply(to: h)
        }

        let method = request.method
        if isHead {
            // NOBODY is set above; a configured handle may still carry the last method.
            if handleConfigured { sluice_easy_setopt_ptr(h, CURLOPT_CUSTOMREQUEST, nil) }
        } else if request.body != .none {
            sluice_easy_setopt_long(h, CURLOPT_UPLOAD, 1)
            sluice_easy_setopt_str(h, CURLOPT_CUSTOMREQUEST, method)
            if case .length(let n) = request.body {
                sluice_easy_setopt_off(h, CURLOPT_INFILESIZE_LARGE, curl_off_t(n))
            }
            sluice_easy_setopt_ptr(h, CURLOPT_READDATA, me)
            sluice_easy_setopt_data_cb(h, CURLOPT_READFUNCTION) { ptr, size, count, ud in
                let t = Unmanaged<CurlUpstreamTransfer>.fromOpaque(ud!).takeUnretainedValue()
                return t.onUploadRequest(UnsafeMutableRawPointer(ptr!), capacity: size * count)
            }
        } else if method != "GET" {
            sluice_easy_setopt_str(h, CURLOPT_CUSTOMREQUEST, method)
        } else if handleConfigured {
            sluice_easy_setopt_ptr(h, CURLOPT_CUSTOMREQUEST, nil)
        }
        let headers = CurlHeaderList(request.headers)
        sluice_easy_setopt_ptr(h, CURLOPT_HTTPHEADER, headers.pointer)
        requestHeaders = consume headers
        if let credentials = request.credentials {
            sluice_easy_setopt_long(h, CURLOPT_HTTPAUTH, sluice_curlauth_basic_digest())
            sluice_easy_setopt_str(h, CURLOPT_USERNAME, credentials.username)
            sluice_easy_setopt_str(h, CURLOPT_PASSWORD, credentials.password.value)
            sluice_easy_setopt_ptr(h, CURLOPT_SEEKDATA, me)
            sluice_easy_setopt_seek_cb(h) { ud, offset, origin in
                let t = Unmanaged<CurlUpstreamTransfer>.fromOpaque(ud!).takeUnretainedValue()
                guard offset == 0, origin == SEEK_SET, let source = t.bodySource, source.rewindRequestBody() else {
                    return Int32(CURL_SEEKFUNC_CANTSEEK)
                }
                return Int32(CURL_SEEKFUNC_OK)
            }
        }
    }

    /// `upstream.http2`'s choice for this try (set on every handle: a configured one may carry
    /// another host's).
    static func applyProtocol(_ choice: HTTP2Mode.ProtocolChoice, to h: UnsafeMutableRawPointer) {
        let version =
            switch choice.version {
            case .http1: CURL_HTTP_VERSION_1_1
            case .negotiated: CURL_HTTP_VERSION_2TLS
            case .priorKnowledge: CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE
            }
        sluice_easy_setopt_long(h, CURLOPT_HTTP_VERSION, Int(version))
        sluice_easy_setopt_long(h, CURLOPT_PIPEWAIT, choice.waitsForMultiplexing ? 1 : 0)
    }

    /// Starts the transfer and its per-try timer (start → response head).
    func start(perTryTimeout: Int) {
        self.perTryTimeout = perTryTimeout
        let timer = LoopTimer(on: session.base, owner: self) { t in
            t.fail(.upstreamTimeout(host: t.target.authority, phase: .noResponseHead))
        }
        timer.arm(milliseconds: perTryTimeout)
        tryTimer = timer
        session.start(handle)
    }

    /// Detaches from curl and the client. Safe to call more than once; never from inside a
    /// curl callback.
    func cancel() {
        guard !finished else { return }
        if let delegate, !inCompletion, continuing == nil { delegate.tryEnded(timings: collectTimings()) }
        finished = true
        tryTimer = nil
        // Abandoned midway (the client left, an operator cancelled): the origin is told by a
        // reset, whatever it was doing.
        if !inCompletion { session.abortConnection(of: handle, multiplexed: priorKnowledge) }
        session.finish(handle, plain: isPlain)
        requestHeaders = nil
        disposition.redirectTo = nil
        delegate = nil
        bodySource = nil
    }

    // MARK: answers to `responseHeadArrived` (only inside that call)

    /// Send the response to the client; `keepAlive` says whether its head promises to keep
    /// the connection open.
    func forward(keepAlive: Bool) { disposition.answer = .forward(keepAlive: keepAlive) }
    /// Drain this response's body, then go on with `next` (`transferRedirected`).
    func follow(_ next: UpstreamRequest) { disposition.answer = .follow(next) }
    /// Drain this response's body for a retry (`transferDiscarded`).
    func discard() { disposition.answer = .discard }

    /// Answer to `responseHeadArrived`: drain the response without sending it (a `304` that
    /// validated a stored response), then `transferAbsorbed`.
    func absorb() { disposition.answer = .absorb }

    func refuse(_ error: ProxyError) { disposition.answer = .refuse(ResponseDisposition.Refusal(error)) }

    func collect(limit: Int) { disposition.answer = .collect(limit: limit) }

    func replaceHead(_ head: ResponseHeadCollector) { self.head = head }

    func detach(to delegate: any UpstreamTransferDelegate) {
        self.delegate = delegate
        detached = true
        resumeDownload()
    }

    /// The client drained its output below the low watermark.
    func resumeDownload() {
        guard downloadPaused, !finished else { return }
        downloadPaused = false
        sluice_curl_easy_pause(handle, CURLPAUSE_CONT)
    }

    /// The client sent more request body.
    func resumeUpload() {
        guard uploadPaused, !finished else { return }
        uploadPaused = false
        sluice_curl_easy_pause(handle, CURLPAUSE_CONT)
    }

    // MARK: curl callbacks (never detach the handle here; return an abort code instead)

    private func openSocket(_ address: UnsafeMutablePointer<curl_sockaddr>) -> curl_socket_t {
        let (fd, error) = Self.openOriginSocket(address, deny: deny, parentProxy: parentProxy, target: target, session: session)
        if let error { pendingError = error }
        return fd
    }

    /// libcurl's open-socket callback for a try to an origin (this transfer's and an upgrade's):
    /// the socket, unless `access.deny` refuses the address, with the error to answer when there
    /// is none. A socket to a parent proxy is marked as such for the session's poll shim.
    static func openOriginSocket(
        _ address: UnsafeMutablePointer<curl_sockaddr>, deny: [IPNetwork],
        parentProxy: UpstreamProxy?, target: RequestTarget,
        session: UpstreamSession
    ) -> (curl_socket_t, ProxyError?) {
        let denied = withUnsafePointer(to: &address.pointee.addr) { SocketAddress.matches($0, deny) }
        if denied {
            // With a parent, the only address Sluice resolves and connects to is the parent's.
            return (CURL_SOCKET_BAD, .destinationDenied(host: parentProxy?.host ?? target.host))
        }
        let fd = socket(address.pointee.family, address.pointee.socktype, address.pointee.protocol)
        if fd >= 0, parentProxy != nil { session.connectsToParentProxy(fd) }
        if fd < 0 {
            // Out of descriptors: libcurl would call it "could not connect" (a 502 "refused"
            // that is not true, and a retry that cannot help).
            return (fd, .socketUnavailable(host: target.authority, reason: socketFailure(errno)))
        }
        return (fd, nil)
    }

    static func socketFailure(_ code: Int32) -> String {
        let text = String(cString: strerror(code))
        switch code {
        case EMFILE: return "\(text) (EMFILE: the proxy is at its file descriptor limit)"
        case ENFILE: return "\(text) (ENFILE: the system is at its file descriptor limit)"
        default: return text
        }
    }

    /// libcurl is about to send the request: the first time, or again by itself — after an
    /// auth challenge (a response came in between), or because a reused connection ended
    /// before any response byte ("Connection died, retrying a fresh connect", for any
    /// method). The origin may have received and acted on the request before its connection
    /// died: a request that is not idempotent is not sent again (RFC 9110 §9.2.2); the try
    /// fails as a reset instead (which `retry.methods` decides about, as for any other).
    private func onPrerequest() -> Int32 {
        defer {
            requestsSent += 1
            responseSinceRequest = false
        }
        guard requestsSent > 0, !responseSinceRequest, !resendable else { return CURL_PREREQFUNC_OK }
        Log.debug("upstream \(target.authority): connection lost before a response; not sending the \(method) again")
        pendingError = .upstreamProtocol(
            host: target.authority,
            reason: "connection lost before a response (a \(method) is not sent twice)")
        pendingKind = .reset
        return CURL_PREREQFUNC_ABORT
    }

    private func onUploadRequest(_ buffer: UnsafeMutableRawPointer, capacity: Int) -> Int {
        guard delegate != nil, let bodySource else { return Int(CURL_READFUNC_ABORT) }
        do {
            guard let n = try bodySource.readRequestBody(into: buffer, capacity: capacity) else {
                uploadPaused = true
                return Int(CURL_READFUNC_PAUSE)
            }
            return n
        } catch {
            pendingError = error
            return Int(CURL_READFUNC_ABORT)
        }
    }

    private func onHeaderLine(_ line: UnsafeRawBufferPointer) -> Int {
        guard delegate != nil else { return 0 }
        responseSinceRequest = true
        // A complete final head stops the per-try timer; it is acted on lazily (see `headComplete`).
        if head.add(line) {
            tryTimer?.stop()
        } else if (100..<200).contains(head.status), continuing == nil, line.allSatisfy({ $0 == 0x0D || $0 == 0x0A }) {
            // The empty line after an interim head: forwarded before the final one comes.
            delegate?.interimResponse(status: head.status, fields: head.endToEndFields())
        }
        return line.count
    }

    private func onBody(_ data: UnsafeRawBufferPointer) -> Int {
        guard let delegate else { return 0 }
        if !headSent { sendResponseHead() }
        if invalidResponse { return 0 }
        if disposition.drains { return data.count }
        if let collector = disposition.collector {
            // Kept for a script (`collect`): nothing reaches the client yet.
            if !collector.append(data) { collectionOverflowed(collector) }
            return invalidResponse ? 0 : data.count
        }
        if !detached, evbuffer_get_length(output) > Self.outputHighWatermark,
            cacheFill?.sharesItsBody != true || !delegate.clientFellBehind(self)
        {
            downloadPaused = true
            return Int(CURL_WRITEFUNC_PAUSE)
        }
        if detached {
            // The client reads the fill (or left): the body goes to the tee alone.
            cacheFill?.append(data)
            bodyBytesSent += Int64(data.count)
            return data.count
        }
        guard data.count > 0 else { return 0 }
        send(data, delegate)
        return data.count
    }

    /// Writes body bytes to the client, re-framed, and tells the cache's tee and the delegate.
    private func send(_ data: UnsafeRawBufferPointer, _ delegate: any UpstreamTransferDelegate) {
        switch framing {
        case .none:
            break  // a body on a bodiless response is dropped, never forwarded
        case .chunked:
            ResponseEncoder.chunk(data, into: output)
        case .length, .close:
            evbuffer_add(output, data.baseAddress, data.count)
        }
        if let cacheFill, framing != .none { cacheFill.append(data) }
        bodyBytesSent += Int64(data.count)
        delegate.responseBodySent(bytes: data.count)
    }

    /// A kept body (`collect`) passed its limit: the delegate answers as for a head, and a
    /// response that goes to the client after all gets the body kept so far (the rest follows
    /// in `onBody`); a refusal leaves `invalidResponse` set (curl is told to stop).
    private func collectionOverflowed(_ collector: ResponseDisposition.Collector) {
        guard let delegate else { return }
        disposition.collector = nil
        disposition.answer = nil
        delegate.collectionOverflowed(UpstreamResponseHead(collected: head), on: self)
        guard settleAnswer(delegate) else { return }
        collector.body.withUnsafeBytes { send($0, delegate) }
    }

    // MARK: response head

    private func sendResponseHead() {
        guard !headSent, !invalidResponse, let delegate else { return }
        if status == 407, let parentProxy {
            // The parent wants credentials from Sluice, not from the client (which never sees
            // the parent, and whose Proxy-Authorization is Sluice's): Sluice's failure.
            invalidResponse = true
            pendingError = .parentProxyFailed(
                proxy: parentProxy.url,
                reason: "answered 407 (upstream_proxy.auth is missing or wrong)")
            return
        }
        headSent = true
        tryTimer?.stop()
        if let continuing {
            guard delegate.continuationArrived(UpstreamResponseHead(collected: head)) else {
                invalidResponse = true  // curl is told to stop; the try aborts
                pendingError = .upstreamProtocol(host: target.authority, reason: "the resume was refused")
                return
            }
            framing = continuing
            return
        }
        disposition.answer = nil
        delegate.responseHeadArrived(UpstreamResponseHead(collected: head), on: self)
        settleAnswer(delegate)
    }

    /// Acts on the delegate's answer about the head (`disposition`): true when the head went
    /// to the client, so that the body follows it.
    @discardableResult
    private func settleAnswer(_ delegate: any UpstreamTransferDelegate) -> Bool {
        guard let keepAlive = disposition.settle() else {
            if let refusal = disposition.refused {
                // Nothing reached the client: the exchange fails with `error` (curl is told to stop).
                headSent = false
                invalidResponse = true
                pendingError = refusal.error
                pendingKind = .other
            }
            return false
        }
        do {
            framing = try ResponseEncoder.forwardedHead(
                head, isHeadRequest: isHead, clientMinorVersion: clientMinorVersion,
                keepAlive: keepAlive, viaLine: viaLine, extraLines: extraHeadLines, into: output)
        } catch {
            // Nothing reached the client: the exchange fails with 502 (curl is told to stop).
            headSent = false
            invalidResponse = true
            pendingError = .upstreamProtocol(host: target.authority, reason: "invalid response head: \(error.reason)")
            return false
        }
        delegate.responseStarted(status: status)
        return true
    }

    private func collectTimings() -> TryTimings {
        var t = TryTimings()
        var v: curl_off_t = 0
        sluice_easy_getinfo_off(handle, CURLINFO_NAMELOOKUP_TIME_T, &v)
        t.dns = Int64(v)
        sluice_easy_getinfo_off(handle, CURLINFO_CONNECT_TIME_T, &v)
        t.connect = Int64(v)
        sluice_easy_getinfo_off(handle, CURLINFO_APPCONNECT_TIME_T, &v)
        t.tls = Int64(v)
        sluice_easy_getinfo_off(handle, CURLINFO_STARTTRANSFER_TIME_T, &v)
        t.firstByte = Int64(v)
        sluice_easy_getinfo_off(handle, CURLINFO_TOTAL_TIME_T, &v)
        t.total = Int64(v)
        var n = 0
        sluice_easy_getinfo_long(handle, CURLINFO_HTTP_VERSION, &n)
        switch n {
        case Int(CURL_HTTP_VERSION_1_0): t.httpVersion = .http1_0
        case Int(CURL_HTTP_VERSION_1_1): t.httpVersion = .http1_1
        case Int(CURL_HTTP_VERSION_2_0): t.httpVersion = .http2
        default: break
        }
        sluice_easy_getinfo_long(handle, CURLINFO_NUM_CONNECTS, &n)
        t.newConnection = n > 0
        t.engine = .curl
        return t
    }

    // MARK: completion

    override func curlDone(_ result: CURLcode) {
        guard !finished, let delegate else { return }
        inCompletion = true
        if continuing == nil { delegate.tryEnded(timings: collectTimings()) }
        // A bodiless response is acted on here: it may still turn out to be a redirect to
        // follow or a response to discard for a retry. So is a complete head followed by a
        // failure — typically an origin that answered early and closed while Sluice was still
        // sending the request body (legal, RFC 9112 §9.6): the client gets that answer, not 502.
        if !headSent, status >= 200, result == CURLE_OK || headComplete { sendResponseHead() }
        if let next = disposition.redirectTo {
            disposition.redirectTo = nil
            cancel()
            if result == CURLE_OK || headComplete {
                delegate.transferRedirected(to: next)
            } else {
                delegate.transferFailed(pendingError ?? classify(result).error, kind: .other)
            }
            return
        }
        if disposition.discarding {
            cancel()
            if disposition.absorbing { delegate.transferAbsorbed() } else { delegate.transferDiscarded() }
            return
        }
        if let collector = disposition.collector, result == CURLE_OK {
            let head = UpstreamResponseHead(collected: head)
            cancel()
            delegate.transferCollected(head, body: collector.body)
            return
        }
        if result == CURLE_OK, !invalidResponse, headSent || status >= 200 {
            if !headSent { sendResponseHead() }
            if invalidResponse {
                cancel()
                delegate.transferFailed(pendingError!, kind: .other)
                return
            }
            if framing == .chunked, !detached { ResponseEncoder.lastChunk(into: output) }
            let reusable = framing != .close
            cancel()
            delegate.transferFinished(reusable: reusable)
            return
        }
        let failure = pendingError.map { (error: $0, kind: pendingKind) } ?? classify(result)
        deadlineExceeded = result == CURLE_OPERATION_TIMEDOUT
        if (headSent && !disposition.withholds) || continuing != nil {
            Log.debug("upstream \(target.authority) failed mid-response: \(failure.error.message)")
            cancel()
            delegate.transferAborted()
        } else {
            cancel()
            delegate.transferFailed(failure.error, kind: failure.kind)
        }
    }

    /// Ends the transfer with `error` from outside curl's callbacks (a timer).
    private func fail(_ error: ProxyError) {
        guard !finished, let delegate else { return }
        inCompletion = true
        if continuing == nil { delegate.tryEnded(timings: collectTimings()) }
        let sent = (headSent && !disposition.withholds) || continuing != nil
        disposition.redirectTo = nil
        cancel()
        if sent { delegate.transferAborted() } else { delegate.transferFailed(error, kind: .timeout) }
    }

    private func classify(_ code: CURLcode) -> (error: ProxyError, kind: TransportErrorKind) {
        CurlFailure.classify(
            code, handle: handle, message: errorBuffer[0] != 0 ? String(cString: errorBuffer) : nil,
            host: target.host, authority: target.authority, purpose: .forward,
            trust: target.scheme == .https ? trust : nil, parent: parentProxy, gotResponse: status != 0)
    }
}

import CCurl
import CLibEvent
import CShims
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// One upgrade handshake (`Upgrade: websocket`) and, after the origin's `101`, the byte tunnel
/// it becomes (`upgrades:`, Sources/SluiceCore/Features/Upgrades.swift).
///
/// The origin connection is set up by libcurl exactly as for any forwarded request — the
/// resolver and `access.deny`, the host's trust evaluators and client certificate
/// (`UpstreamTLS`), `upstream: { scheme: https }`, a parent proxy (through `CONNECT`) — with
/// `CONNECT_ONLY`, and HTTP/1.1 only (ALPN offers no h2). Sluice then speaks on that connection
/// itself with `curl_easy_send`/`curl_easy_recv` (so TLS stays libcurl's): it writes the
/// adapted handshake, reads the answer with an `UpgradeResponseReader`, and relays either a
/// complete non-101 answer (the client connection closes after it) or, after a `101`, every
/// byte both ways. Backpressure: the origin is not read while the client's output holds more
/// than `highWatermark`; the client is not read while its bytes wait to be sent (its socket
/// stops at its input watermark). Nothing moving either way for the policy's
/// `upgrades.idle_timeout` closes both sides.
///
/// Threading: created, driven and finished on its worker's thread only. Lifetimes across the
/// C boundary: the handle stays on the worker's multi until `cancel()` (libcurl finds a
/// CONNECT_ONLY connection only through a handle still on its multi, and closes it when the
/// handle leaves); the events on the origin socket and the timer hold `self` unretained and
/// are dropped in `cancel()`, which the owning connection calls before it lets go of the
/// transfer.
final class UpgradeTransfer: CurlTransfer {
    /// Stop reading the origin while this many bytes wait for the client (1 MiB).
    static let highWatermark = 1 << 20

    enum Phase: Equatable {
        /// libcurl is connecting (and handshaking TLS, and tunnelling through a parent).
        case connecting
        /// The handshake request is sent; the answer's head is awaited.
        case awaitingAnswer
        /// A non-101 answer's body is relayed; the upstream framed it so.
        case relayingAnswer(UpgradeResponseReader.BodyFraming)
        /// `101`: bytes move both ways.
        case switched
        case finished
    }

    private unowned(unsafe) let connection: ClientConnection
    private let session: UpstreamSession
    private let handle: UnsafeMutableRawPointer
    let target: RequestTarget
    private let trust: ServerTrust
    private let parentProxy: UpstreamProxy?
    private let deny: [IPNetwork]
    private let idleTimeout: Int
    private let errorBuffer: UnsafeMutablePointer<CChar>
    private(set) var phase = Phase.connecting
    /// The handshake bytes not yet sent.
    private let pending: OpaquePointer
    private var reader = UpgradeResponseReader()
    /// How the client's copy of a non-101 answer is framed (ResponseEncoder chose it).
    private var clientFraming = ResponseEncoder.Framing.none
    private var readEvent: SocketEvent<UpgradeTransfer>?
    private var writeEvent: SocketEvent<UpgradeTransfer>?
    private var writeArmed = false
    private var timer: LoopTimer<UpgradeTransfer>?
    private var deadline = 0
    /// Where origin reads land: the worker's scratch buffer (64 KiB), whose bytes are copied
    /// out before the read callback returns, so an idle tunnel holds no read buffer of its own.
    private let scratch: UnsafeMutableRawBufferPointer
    private var pendingError: ProxyError?
    /// The origin is not read until the client drains (backpressure).
    private var originPaused = false

    init(
        connection: ClientConnection, request: UpstreamRequest, upgrade: String, idleTimeout: Int,
        config: ServerConfiguration
    ) {
        self.connection = connection
        session = connection.worker.session
        target = request.target
        trust = request.trust
        parentProxy = request.parentProxy
        deny = config.access.deny
        self.idleTimeout = idleTimeout
        scratch = connection.worker.readSpill
        handle = session.makeHandle().handle
        errorBuffer = .allocate(capacity: Int(CURL_ERROR_SIZE) + 1)
        errorBuffer.initialize(repeating: 0, count: Int(CURL_ERROR_SIZE) + 1)
        pending = evbuffer_new()
        super.init()
        Self.writeHandshake(request, upgrade: upgrade, into: pending)
        let h = handle
        let me = Unmanaged.passUnretained(self).toOpaque()
        sluice_easy_setopt_ptr(h, CURLOPT_PRIVATE, me)
        sluice_easy_setopt_str(h, CURLOPT_URL, target.url)
        sluice_easy_setopt_str(h, CURLOPT_PROTOCOLS_STR, "http,https")
        sluice_easy_setopt_long(h, CURLOPT_CONNECT_ONLY, 1)
        sluice_easy_setopt_long(h, CURLOPT_HTTP_VERSION, Int(CURL_HTTP_VERSION_1_1))
        sluice_easy_setopt_ptr(h, CURLOPT_ERRORBUFFER, errorBuffer)
        sluice_easy_setopt_long(h, CURLOPT_CONNECTTIMEOUT_MS, config.timeouts.upstreamConnect)
        request.parentProxy?.apply(to: h, tunnel: true)
        if target.scheme == .https {
            UpstreamTLS.configure(
                h, trust: request.trust, clientCertificate: request.clientCertificate,
                defaultCAFile: config.tls.caFile)
            // A pooled connection opened before a reload is kept out, as for any TLS try.
            request.reuse.apply(to: h)
        }
        sluice_easy_setopt_ptr(h, CURLOPT_OPENSOCKETDATA, me)
        sluice_easy_setopt_opensocket_cb(h) { clientp, _, address in
            let t = Unmanaged<UpgradeTransfer>.fromOpaque(clientp!).takeUnretainedValue()
            return t.openSocket(address!)
        }
        timer = LoopTimer(on: session.base, owner: self) { $0.timerFired() }
    }

    deinit {
        cancel()  // normally done already by whoever ended it; never leave the handle on the multi
        errorBuffer.deallocate()
        evbuffer_free(pending)
    }

    /// The handshake as the origin gets it: the request line in origin-form, `Host` (unless
    /// the lines carry one: an `upstream:` port override), the forwarded header lines, and the
    /// upgrade's own `Connection` and `Upgrade`.
    static func writeHandshake(_ request: UpstreamRequest, upgrade: String, into out: OpaquePointer) {
        var text = "\(request.method) \(request.target.originForm) HTTP/1.1\r\n"
        if !request.headers.carriesHost {
            let t = request.target
            let defaultPort = t.port == (t.scheme == .https ? 443 : 80)
            let host = t.host.utf8.contains(0x3A) ? "[\(t.host)]" : t.host
            text += "Host: " + (defaultPort ? host : "\(host):\(t.port)") + "\r\n"
        }
        request.headers.withBytes { bytes, _ in text += String(decoding: bytes, as: UTF8.self) }
        text += "Connection: Upgrade\r\nUpgrade: \(upgrade)\r\n\r\n"
        text.withUTF8 { _ = evbuffer_add(out, $0.baseAddress, $0.count) }
    }

    /// Starts connecting; `perTryTimeout` bounds the time until the answer's head.
    func start(perTryTimeout: Int) {
        arm(timeout: perTryTimeout)
        session.start(handle)
    }

    private func arm(timeout ms: Int) {
        deadline = MonotonicClock.milliseconds() + ms
        timer?.arm(milliseconds: ms)
    }

    private func openSocket(_ address: UnsafeMutablePointer<curl_sockaddr>) -> curl_socket_t {
        let (fd, error) = CurlUpstreamTransfer.openOriginSocket(
            address, deny: deny, parentProxy: parentProxy,
            target: target, session: session)
        if let error { pendingError = error }
        return fd
    }

    // MARK: connected

    override func curlDone(_ result: CURLcode) {
        guard phase == .connecting else { return }
        var fd: curl_socket_t = -1
        if result == CURLE_OK { sluice_easy_getinfo_socket(handle, &fd) }
        guard fd >= 0 else {
            let failure =
                pendingError.map { (error: $0, kind: TransportErrorKind.other) }
                ?? CurlFailure.classify(
                    result, handle: handle, message: errorBuffer[0] != 0 ? String(cString: errorBuffer) : nil,
                    host: target.host, authority: target.authority, purpose: .forward,
                    trust: target.scheme == .https ? trust : nil, parent: parentProxy)
            return failBeforeAnswer(failure.error, kind: failure.kind)
        }
        phase = .awaitingAnswer
        let read = SocketEvent(on: session.base, fd: fd, .read, owner: self) { t, _ in t.originReadable() }
        readEvent = read
        writeEvent = SocketEvent(on: session.base, fd: fd, .write, owner: self) { t, _ in t.originWritable() }
        read.arm()
        sendToOrigin()
        if phase != .finished { originReadable() }  // TLS may hold bytes already
    }

    /// The try's timings, as for any forwarded request (DNS, connect, TLS; first byte = now).
    func timings() -> TryTimings {
        var t = TryTimings()
        var v: curl_off_t = 0
        sluice_easy_getinfo_off(handle, CURLINFO_NAMELOOKUP_TIME_T, &v)
        t.dns = Int64(v)
        sluice_easy_getinfo_off(handle, CURLINFO_CONNECT_TIME_T, &v)
        t.connect = Int64(v)
        sluice_easy_getinfo_off(handle, CURLINFO_APPCONNECT_TIME_T, &v)
        t.tls = Int64(v)
        sluice_easy_getinfo_off(handle, CURLINFO_TOTAL_TIME_T, &v)
        t.total = Int64(v)
        t.engine = .curl
        return t
    }

    // MARK: client side (called by the connection)

    /// The client sent bytes: after the switch they go to the origin (before it they wait).
    func clientReadable() {
        if phase == .switched { sendToOrigin() }
    }

    /// The client's output fell below its low watermark: the origin is read again.
    func clientDrained() {
        guard originPaused, phase != .finished else { return }
        originPaused = false
        readEvent?.arm()
        originReadable()
    }

    // MARK: origin I/O

    private func originWritable() { sendToOrigin() }

    /// Sends the handshake, then (switched) what the client sent, until the socket is full.
    private func sendToOrigin() {
        while phase != .finished {
            let fromClient = evbuffer_get_length(pending) == 0
            if fromClient && phase != .switched { break }
            let source = fromClient ? connection.clientInput : pending
            var iov = iovec()
            guard evbuffer_peek(source, -1, nil, &iov, 1) > 0, iov.iov_len > 0 else { break }
            var sent = 0
            let rc = sluice_curl_easy_send(handle, iov.iov_base, iov.iov_len, &sent)
            if rc == CURLE_AGAIN {
                setWriteArmed(true)
                return
            }
            guard rc == CURLE_OK else { return originFailed("send failed: \(String(cString: sluice_curl_easy_strerror(rc)))") }
            evbuffer_drain(source, sent)
            if fromClient {
                touch()
                connection.driver.tunnels.moved(up: sent, down: 0)
                connection.inputConsumed()
            }
        }
        setWriteArmed(false)
    }

    private func setWriteArmed(_ on: Bool) {
        guard on != writeArmed, let writeEvent else { return }
        writeArmed = on
        if on { writeEvent.arm() } else { writeEvent.stop() }
    }

    /// Reads what the origin sent until it has no more, the client's output is full, or the
    /// transfer ends.
    private func originReadable() {
        while phase != .finished, !originPaused, let buffer = scratch.baseAddress {
            if phase != .awaitingAnswer, evbuffer_get_length(connection.clientOutput) >= Self.highWatermark {
                originPaused = true
                readEvent?.stop()
                return
            }
            var n = 0
            let rc = sluice_curl_easy_recv(handle, buffer, scratch.count, &n)
            if rc == CURLE_AGAIN { return }
            guard rc == CURLE_OK else { return originFailed("receive failed: \(String(cString: sluice_curl_easy_strerror(rc)))") }
            if n == 0 { return originClosed() }
            touch()
            received(UnsafeRawBufferPointer(start: buffer, count: n))
        }
    }

    /// Bytes from the origin, by phase.
    private func received(_ bytes: UnsafeRawBufferPointer) {
        var offset = 0
        while offset < bytes.count, phase != .finished {
            let rest = UnsafeRawBufferPointer(rebasing: bytes[offset...])
            switch phase {
            case .switched:
                relay(rest)
                return
            case .awaitingAnswer:
                let result: (consumed: Int, event: UpgradeResponseReader.Event?)
                do {
                    result = try reader.read(rest)
                } catch {
                    return failBeforeAnswer(
                        .upstreamProtocol(host: target.authority, reason: "invalid handshake answer: \(error)"),
                        kind: .other)
                }
                offset += result.consumed
                switch result.event {
                case .switched?:
                    guard connection.driver.upgrades.switched(reader.head, on: self) else { return }
                    phase = .switched
                    reader = UpgradeResponseReader()  // its buffers are not needed any more
                    timer?.stop()
                    arm(timeout: idleTimeout)
                    sendToOrigin()  // what the client sent after its handshake
                case .answered(let framing)?:
                    guard let relayed = connection.driver.upgrades.answered(reader.head, on: self) else { return }
                    clientFraming = relayed
                    if framing == .none || framing == .length(0) { return answerComplete() }
                    phase = .relayingAnswer(framing)
                    timer?.stop()
                    arm(timeout: idleTimeout)
                default:
                    break
                }
            case .relayingAnswer(let framing):
                if framing == .close {
                    relay(rest)
                    return
                }
                let result: (consumed: Int, event: UpgradeResponseReader.Event?)
                do {
                    result = try reader.read(rest)
                } catch {
                    return aborted("invalid answer body: \(error)")
                }
                relay(UnsafeRawBufferPointer(rebasing: rest[0..<result.consumed]))
                offset += result.consumed
                if result.event == .bodyEnded { return answerComplete() }
            case .connecting, .finished:
                return
            }
        }
    }

    /// Origin bytes to the client: as they are, or re-chunked (a non-101 answer delimited by
    /// the close, sent to the client chunked).
    private func relay(_ bytes: UnsafeRawBufferPointer) {
        guard bytes.count > 0 else { return }
        if case .relayingAnswer(.close) = phase, clientFraming == .chunked {
            ResponseEncoder.chunk(bytes, into: connection.clientOutput)
        } else {
            evbuffer_add(connection.clientOutput, bytes.baseAddress, bytes.count)
        }
        connection.driver.tunnels.moved(up: 0, down: bytes.count)
        connection.scheduleFlush()
    }

    private func originClosed() {
        switch phase {
        case .switched:
            finish()
            connection.driver.upgrades.ended(error: nil)
        case .relayingAnswer(.close):
            if clientFraming == .chunked { ResponseEncoder.lastChunk(into: connection.clientOutput) }
            answerComplete()
        case .relayingAnswer:
            aborted("the origin closed before the end of its answer")
        default:
            failBeforeAnswer(
                .upstreamProtocol(host: target.authority, reason: "connection closed before a response head"), kind: .reset)
        }
    }

    private func originFailed(_ reason: String) {
        switch phase {
        case .switched:
            finish()
            connection.driver.upgrades.ended(error: "upgraded connection to \(target.authority): \(reason)")
        case .relayingAnswer:
            aborted(reason)
        default:
            failBeforeAnswer(.upstreamProtocol(host: target.authority, reason: reason), kind: .reset)
        }
    }

    private func answerComplete() {
        finish()
        connection.scheduleFlush()
        connection.driver.upgrades.answerFinished()
    }

    private func aborted(_ reason: String) {
        finish()
        connection.driver.upgrades.aborted(reason: "upstream \(target.authority): \(reason)")
    }

    private func failBeforeAnswer(_ error: ProxyError, kind: TransportErrorKind) {
        let timings = timings()
        finish()
        connection.driver.upgrades.failed(error, kind: kind, timings: timings)
    }

    // MARK: timer

    /// Something moved: the idle deadline moves with it (checked when the timer fires, so
    /// that a busy tunnel re-arms nothing per read).
    private func touch() {
        if phase != .awaitingAnswer { deadline = MonotonicClock.milliseconds() + idleTimeout }
    }

    private func timerFired() {
        let now = MonotonicClock.milliseconds()
        if phase != .awaitingAnswer && phase != .connecting && deadline > now {
            let left = deadline - now
            timer?.arm(milliseconds: left)
            return
        }
        switch phase {
        case .connecting, .awaitingAnswer:
            failBeforeAnswer(.upstreamTimeout(host: target.authority, phase: .noResponseHead), kind: .timeout)
        case .switched:
            finish()
            connection.driver.upgrades.ended(error: "upgraded connection idle for \(idleTimeout) ms")
        case .relayingAnswer:
            aborted("answer body idle for \(idleTimeout) ms")
        case .finished:
            break
        }
    }

    // MARK: end

    private func finish() {
        cancel()
    }

    /// Frees the events and the handle (which closes the origin connection). Safe to call
    /// more than once.
    func cancel() {
        guard phase != .finished else { return }
        phase = .finished
        readEvent = nil
        writeEvent = nil
        timer = nil
        session.discard(handle)
    }
}

import CCurl
import CLibEvent
import CShims
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// One client TCP connection on a listener: the socket glue. It reads request heads with the
/// strict codec and hands each to the request chain through its `ExchangeDriver` (one request
/// at a time; pipelined requests wait in the input buffer), reads request bodies on the
/// driver's demand, writes what the exchange puts in its output in the worker's flush pass,
/// keeps its idle and header timers, answers Sluice's own errors, and closes. After an
/// intercepted CONNECT its bytes go through a TLS bufferevent instead of its own socket.
///
/// Threading: owned by its worker's event-loop thread; every callback runs there. The worker
/// keeps it alive (its `connections` table) until `close()`.
final class ClientConnection: ClientSocketOwner {
    enum State {
        /// Waiting for (or reading) a request head.
        case awaitingHead
        /// The driver has a request (`ExchangeDriver.phase` says what it waits for).
        case exchanging
        /// A final response is queued; the connection closes once it is flushed.
        case closing
        case closed
    }

    enum TimerPurpose { case idle, header, collapsed }

    /// How bytes move between Sluice and the client.
    enum Transport {
        /// A plain socket that Sluice reads and writes itself (the hot path).
        case socket(ClientSocket)
        /// A TLS bufferevent on the same socket (interception): libevent does the I/O.
        case tls(OpaquePointer)
    }

    /// Stop reading from a client once this many unprocessed bytes wait (256 KiB).
    static let inputHighWatermark = ClientSocket.inputHighWatermark
    /// Resume a paused upstream once the client's output falls to this (256 KiB).
    static let outputLowWatermark = ClientSocket.outputLowWatermark

    /// Unowned without a check, as the driver's (a checked access costs an atomic retain and
    /// release, about ten a request here): the worker holds every connection it accepted in
    /// `connections` and outlives them, and a connection runs only on the worker's thread.
    unowned(unsafe) let worker: Worker
    /// The connection as the stages see it: its peer, its listener's kind, its interception
    /// and accepted proxy credential.
    let client: RequestClient
    /// Performs the current request's stages and tries.
    private(set) var driver: ExchangeDriver!
    /// The client's socket: Sluice's own until an interception hands it to a TLS bufferevent.
    private(set) var transport: Transport
    /// The transport's buffers: what the client sent and Sluice has not consumed, and what
    /// waits to be written to it.
    private(set) var clientInput: OpaquePointer
    private(set) var clientOutput: OpaquePointer
    /// Queued in the worker's flush pass (see `scheduleFlush`).
    var flushScheduled = false
    var peer: String { client.peer }
    private(set) var state: State = .awaitingHead
    private var parser: HTTPRequestParser
    /// The idle/header timer (one event, re-armed with a purpose); dropped at the close.
    private var timer: LoopTimer<ClientConnection>?
    private var timerPurpose: TimerPurpose = .idle
    /// Whether the request's body has been read to its end, and whether the client asked for
    /// the connection to end after it.
    private(set) var requestBodyDone = true
    var wantsKeepAlive = true
    private var continueSent = false
    /// Close with a reset (SO_LINGER 0) rather than a FIN: see `ExchangeDriver.transferAborted`.
    var abortiveClose = false
    /// True while `processInput` loops, so that an exchange ending synchronously inside it
    /// lets the loop go on instead of recursing (a pipelined burst must not deepen the stack).
    private var processingInput = false
    /// The client's address as `ConnectionLimits` counted it (set by the worker at accept).
    var clientKey: ConnectionLimits.ClientKey?

    /// The request in flight, if one got past admission.
    var exchange: Exchange? { driver.exchange }

    init(
        worker: Worker, mode: ListenerMode, fd: Int32, peer: String, address: String, forwarding: ForwardingFields? = nil
    ) {
        self.worker = worker
        client = RequestClient(peer: peer, address: address, mode: mode, forwarding: forwarding)
        parser = HTTPRequestParser(limits: .init(worker.config.limits))
        let socket = ClientSocket(base: worker.base, fd: fd, spill: worker.readSpill)
        transport = .socket(socket)
        clientInput = socket.input
        clientOutput = socket.output
        driver = ExchangeDriver(connection: self, worker: worker)
        socket.owner = self
        timer = LoopTimer(on: worker.base, owner: self, lazy: true) { $0.timerFired() }
        armTimer(.idle)
    }

    // MARK: transport

    /// Moves the connection onto a TLS bufferevent (interception): its callbacks point here,
    /// with the same watermarks as the plain socket's.
    private func adoptTLS(_ bev: OpaquePointer) {
        transport = .tls(bev)
        clientInput = bufferevent_get_input(bev)
        clientOutput = bufferevent_get_output(bev)
        let me = Unmanaged.passUnretained(self).toOpaque()
        bufferevent_setcb(
            bev,
            { _, arg in
                Unmanaged<ClientConnection>.fromOpaque(arg!).takeUnretainedValue().onReadable()
            },
            { _, arg in
                Unmanaged<ClientConnection>.fromOpaque(arg!).takeUnretainedValue().onWritable()
            },
            { _, what, arg in
                Unmanaged<ClientConnection>.fromOpaque(arg!).takeUnretainedValue().onEvent(what)
            }, me)
        bufferevent_setwatermark(bev, Int16(EV_READ), 0, Self.inputHighWatermark)
        bufferevent_setwatermark(bev, Int16(EV_WRITE), Self.outputLowWatermark, 0)
        bufferevent_enable(bev, Int16(EV_READ | EV_WRITE))
    }

    /// The TLS bufferevent, once an interception moved the connection onto one.
    private var tlsBufferevent: OpaquePointer? {
        if case .tls(let bev) = transport { return bev }
        return nil
    }

    /// Whether the client's bytes are read (off while the connection closes, or while a
    /// tunnel's other side is full).
    func setReading(_ on: Bool) {
        switch transport {
        case .socket(let socket): socket.wantsInput = on
        case .tls(let bev):
            if on { bufferevent_enable(bev, Int16(EV_READ)) } else { bufferevent_disable(bev, Int16(EV_READ)) }
        }
    }

    /// Input was consumed: a plain socket that stopped at its watermark reads again (a TLS
    /// bufferevent resumes by itself).
    func inputConsumed() {
        if case .socket(let socket) = transport { socket.inputConsumed() }
    }

    /// Output was added: it is written in the worker's flush pass, after the callback that
    /// added it (a TLS bufferevent writes by itself).
    func scheduleFlush() {
        guard case .socket = transport, !flushScheduled else { return }
        flushScheduled = true
        worker.scheduleFlush(self)
    }

    /// The worker's flush pass: writes what is pending (see `ClientSocket.flush`).
    func flushOutput() {
        guard case .socket(let socket) = transport else { return }
        if case .closed = state { return }
        guard socket.flush() else { return socketClosed() }
        if socket.pendingOutput <= Self.outputLowWatermark { onWritable() }
    }

    /// Whether the output can take file segments the kernel sends (`sendfile`, a disk hit:
    /// `DiskHitStream`): a plain socket, which is told to expect them; not a TLS one, which
    /// must encrypt every byte in user space.
    func acceptsFileSegments() -> Bool {
        guard case .socket(let socket) = transport else { return false }
        socket.sendFiles()
        return true
    }

    func socketReadable() { onReadable() }
    func socketDrained() { onWritable() }
    func socketClosed() { onEvent(Int16(BEV_EVENT_EOF)) }

    /// Hands the connection to an `Interception`: the CONNECT is answered and the socket moves
    /// to a TLS bufferevent; the requests inside are read like any others.
    func intercept(_ target: RequestTarget, _ exchange: Exchange) throws(ProxyError) {
        // CONNECT is refused inside an intercepted connection, so this is the plain socket.
        guard case .socket(let socket) = transport else { throw .badURL("CONNECT inside an intercepted connection") }
        // The TLS bufferevent takes the socket over, so nothing may wait in the plain one: a
        // client that sent bytes before the CONNECT's answer is not speaking TLS to us (earlier
        // answers, still queued for the flush pass, are written now).
        socket.flush()
        guard evbuffer_get_length(clientInput) == 0, evbuffer_get_length(clientOutput) == 0 else {
            throw .malformedRequest("data after CONNECT before its answer")
        }
        guard
            let (interception, bev) = try Interception.start(
                fd: socket.fd, target: target, base: worker.base, server: worker.interception.current)
        else {
            Log.debug("\(peer): cannot answer the CONNECT to \(target.authority)")
            close()
            return
        }
        exchange.summary.status = 200
        exchange.end(.intercepted)
        driver.exchange = nil
        // The descriptor now belongs to the TLS bufferevent: the plain socket lets go of it
        // without closing it.
        _ = socket.detach()
        guard let bev else {
            Log.error("interception of \(target.authority): cannot create the TLS bufferevent")
            abandon()
            return
        }
        client.interception = interception
        parser = HTTPRequestParser(limits: .init(worker.config.limits))
        adoptTLS(bev)
        state = .awaitingHead
        armTimer(.header)  // the handshake and the first request head, within the header timeout
    }

    // MARK: events

    private func onReadable() {
        switch state {
        case .awaitingHead:
            if timerPurpose == .idle { armTimer(.header) }
            processInput()
        case .exchanging:
            driver.clientReadable()
        case .closing, .closed:
            break  // held in the input buffer (bounded by the read watermark)
        }
    }

    private func onWritable() {
        switch state {
        case .exchanging:
            driver.clientDrained()
        case .closing:
            if evbuffer_get_length(clientOutput) == 0 { close() }
        case .awaitingHead, .closed:
            break
        }
    }

    private func onEvent(_ what: Int16) {
        if what & Int16(BEV_EVENT_CONNECTED) != 0 {
            client.interception?.established = true
            return
        }
        if what & Int16(BEV_EVENT_EOF | BEV_EVENT_ERROR) != 0 {
            if let interception = client.interception, !interception.established {
                Log.warning(interception.handshakeFailure(tlsBufferevent))
            }
            if case .exchanging = state, driver.clientClosed() { return }
            // The client is gone (or half-closed): nothing more can be delivered, so any
            // upstream transfer is cancelled at once.
            close()
        }
    }

    private func timerFired() {
        if let interception = client.interception, !interception.established {
            // Nothing can be said to a client that has not finished the TLS handshake.
            Log.warning("interception failed: no TLS handshake within \(worker.config.timeouts.clientHeader) ms from \(peer)")
            close()
            return
        }
        switch (timerPurpose, state) {
        case (.idle, _):
            close()
        case (.header, .awaitingHead):
            respondError(.headerTimeout(milliseconds: worker.config.timeouts.clientHeader))
        case (.header, .exchanging):
            driver.headerTimerFired()
        case (.collapsed, .exchanging):
            driver.collapsedWaitTick()
        default:
            break
        }
    }

    func armTimer(_ purpose: TimerPurpose) {
        timerPurpose = purpose
        let ms: Int
        switch purpose {
        case .idle: ms = worker.config.timeouts.clientIdle
        case .header: ms = worker.config.timeouts.clientHeader
        case .collapsed: ms = CacheStore.collapsedWaitMilliseconds
        }
        timer?.arm(milliseconds: ms)
    }

    func stopTimer() { timer?.stop() }

    // MARK: requests

    /// Parses heads from the input buffer and dispatches them, until one starts an exchange
    /// that completes later, or the input runs out.
    private func processInput() {
        processingInput = true
        defer { processingInput = false }
        while case .awaitingHead = state {
            let input = clientInput  // re-read: interception swaps the bufferevent mid-loop
            if worker.isDraining && parser.isIdle && evbuffer_get_length(input) == 0 {
                closeAfterFlush()  // a response may still wait for this pass's flush
                return
            }
            var iov = iovec()
            guard evbuffer_peek(input, -1, nil, &iov, 1) > 0, iov.iov_len > 0 else { return }
            let consumed: Int
            let event: HTTPRequestParser.Event?
            do {
                (consumed, event) = try parser.parse(UnsafeRawBufferPointer(start: iov.iov_base, count: iov.iov_len))
            } catch {
                evbuffer_drain(input, evbuffer_get_length(input))
                respondError(error)
                return
            }
            evbuffer_drain(input, consumed)
            inputConsumed()
            // The event consumed: its head moves to `handle` (matched in place, it was copied,
            // each of its arrays retained, and the event destroyed after).
            if case .head(let head)? = consume event {
                timer?.stop()
                handle(head)
            }
        }
    }

    /// A request head arrived: admission makes its exchange (which takes the head: a copy
    /// retained each of its arrays), and the driver runs its stages.
    private func handle(_ head: consuming HTTPRequestHead) {
        requestBodyDone = !head.hasBody
        continueSent = false
        wantsKeepAlive = head.keepAlive && head.minorVersion == 1
        let method = head.method  // a literal for the common methods; `begin` takes it too
        let exchange: Exchange
        do {
            let target = try Admission.target(
                of: head, client: client, connectPorts: worker.config.access.connectPorts,
                viaPseudonym: worker.viaPseudonym)
            exchange = try Admission.begin(consume head, method: method, target, client: client, services: worker)
        } catch {
            respondError(error, method: method)
            return
        }
        state = .exchanging
        driver.start(exchange)
    }

    /// Answers `Expect: 100-continue` once per request: Sluice itself asks for the body,
    /// since it has accepted the request and will stream it on.
    func sendContinueIfExpected(_ head: HTTPRequestHead) {
        guard head.expectsContinue, head.hasBody, head.minorVersion == 1, !continueSent else { return }
        continueSent = true
        ResponseEncoder.interimContinue(into: clientOutput)
        scheduleFlush()
    }

    /// Runs a copy of the parser (a value) over the buffered input without consuming it.
    /// True once it yields body bytes or the end of the body.
    func probeBufferedBody() throws(ProxyError) -> Bool {
        var probe = parser
        let maxSegments = 16
        var segments = [iovec](repeating: iovec(), count: maxSegments)
        let count = Int(evbuffer_peek(clientInput, -1, nil, &segments, Int32(maxSegments)))
        for segment in segments.prefix(min(count, maxSegments)) {
            var offset = 0
            while offset < segment.iov_len {
                let (consumed, event) = try probe.parse(
                    UnsafeRawBufferPointer(start: segment.iov_base + offset, count: segment.iov_len - offset))
                if event != nil { return true }
                if consumed == 0 { break }
                offset += consumed
            }
        }
        return try probe.parse(UnsafeRawBufferPointer(start: nil, count: 0)).event != nil
    }

    /// Decodes client body bytes straight from the input buffer into `buffer`: the count,
    /// 0 at the end of the body, nil when none are buffered yet.
    func readClientBody(into buffer: UnsafeMutableRawPointer, capacity: Int) throws(ProxyError) -> Int? {
        if requestBodyDone { return 0 }
        let input = clientInput
        var written = 0
        while written < capacity {
            var iov = iovec()
            let segments = evbuffer_peek(input, -1, nil, &iov, 1)
            let available = segments > 0 ? min(iov.iov_len, capacity - written) : 0
            // An empty input still lets the parser report the end of a finished body.
            let (consumed, event) = try parser.parse(UnsafeRawBufferPointer(start: iov.iov_base, count: available))
            if case .body(let range)? = event {
                (buffer + written).copyMemory(from: iov.iov_base! + range.lowerBound, byteCount: range.count)
                written += range.count
            }
            evbuffer_drain(input, consumed)
            inputConsumed()
            if case .end? = event {
                requestBodyDone = true
                return written
            }
            if consumed == 0 && event == nil { break }
        }
        return written > 0 ? written : nil
    }

    /// A response that starts before the request body was read to its end promises to close:
    /// the rest of that body cannot be told apart from a next request without reading it.
    var keepsAliveAfterResponse: Bool { wantsKeepAlive && !worker.isDraining && requestBodyDone }

    // MARK: ending

    /// Answers `error` with Sluice's own plain-text response. The connection stays open only
    /// when the error allows it and the request's body was fully read. `method`: the refused
    /// request's, when it got no exchange.
    func respondError(_ error: ProxyError, method: String = "") {
        let keep = !error.closesConnection && requestBodyDone && wantsKeepAlive && !worker.isDraining
        if case .luaResponded(_, let response) = error {
            // A script answered (`req:respond`): its response, and the exchange ends `ok`.
            let head = exchange?.head.method == "HEAD"
            ResponseEncoder.localAnswer(response, headRequest: head, close: !keep, into: clientOutput)
        } else {
            ResponseEncoder.error(error, close: !keep, into: clientOutput)
        }
        scheduleFlush()
        Log.debug("\(peer): \(error.status) \(error.message)")
        if case .luaResponded = error, let exchange {
            exchange.summary.status = error.status
            exchange.end(.ok)
        } else if let exchange {
            exchange.summary.status = error.status
            exchange.summary.errorKind = error.kind
            exchange.end(.error, error: error.message)
        } else if let monitor = worker.pipeline.monitor {
            // Rejected before a request existed (unparseable): still one access-log line.
            var summary = ExchangeSummary(
                id: worker.nextRequestID(), client: peer,
                method: method, url: "", policy: "")
            summary.status = error.status
            summary.outcome = .error
            summary.error = error.message
            summary.errorKind = error.kind
            monitor.exchangeEnded(summary)
        }
        if keep {
            exchangeEnded()
        } else {
            closeAfterFlush()
        }
    }

    /// The exchange's response is complete (`keepAlive`: it promised to keep the connection):
    /// the next request, or the end.
    func exchangeFinished(keepAlive: Bool) {
        if keepAlive && requestBodyDone && wantsKeepAlive {
            exchangeEnded()
        } else {
            closeAfterFlush()
        }
    }

    /// Back to reading the next request, or closing, after an exchange ended cleanly.
    private func exchangeEnded() {
        driver.release()
        driver.exchange = nil
        state = .awaitingHead
        if worker.isDraining {
            closeAfterFlush()
            return
        }
        armTimer(evbuffer_get_length(clientInput) > 0 ? .header : .idle)
        setReading(true)
        if !processingInput { processInput() }
    }

    func closeAfterFlush() {
        driver.release()
        state = .closing
        timer?.stop()
        setReading(false)
        if evbuffer_get_length(clientOutput) == 0 { close() } else { scheduleFlush() }
    }

    /// Frees the socket and cancels whatever the connection was doing upstream.
    func close() {
        if case .closed = state { return }
        driver.cancel()
        state = .closed
        timer = nil
        switch transport {
        case .socket(let socket):
            socket.close(abortive: abortiveClose)
        case .tls(let bev):
            if client.interception?.established == true { sluice_bufferevent_ssl_shutdown(bev) }
            bufferevent_free(bev)
        }
        worker.connectionClosed(self)
    }

    /// Forgets the connection without touching its bufferevent (already freed).
    private func abandon() {
        driver.exchange = nil
        state = .closed
        timer = nil
        worker.connectionClosed(self)
    }

    /// Called by the worker when it starts draining: idle connections close now, busy ones
    /// after their current exchange. "Idle" includes a connection whose last response was
    /// queued in this loop pass and waits for the worker's flush pass: it closes after it.
    func drain() {
        if case .awaitingHead = state, parser.isIdle, evbuffer_get_length(clientInput) == 0 {
            closeAfterFlush()
        }
    }
}

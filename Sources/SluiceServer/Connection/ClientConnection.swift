import CCurl
import CLibEvent
import CShims
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// One client TCP connection on a forward-proxy listener: reads requests with the strict
/// codec, forwards each through an `UpstreamTransfer` (one at a time; pipelined requests wait
/// in the input buffer), answers its own errors, and becomes a byte tunnel after CONNECT.
///
/// Threading: owned by its worker's event-loop thread; every callback runs there. The worker
/// keeps it alive (its `connections` table) until `close()`.
final class ClientConnection: UpstreamTransferDelegate, RequestBodySource, ClientSocketOwner {
    enum State {
        /// Waiting for (or reading) a request head.
        case awaitingHead
        /// An adapter that must wait (a token fetch) has not answered yet.
        case adapting
        /// Waiting for an upstream slot of the worker (`UpstreamGate`), with this ticket.
        case queued(UInt64)
        /// A chunked request waits for its first chunk-size line, which is validated before
        /// anything is sent upstream (so a malformed body never opens an upstream connection).
        case awaitingBody(HTTPRequestHead, Exchange)
        /// A retryable request's body is being read whole, so that it can be replayed.
        case bufferingBody(HTTPRequestHead, Exchange)
        /// A try failed; the next one starts when the backoff timer fires.
        case waitingToRetry(OpaquePointer)
        /// A request is being forwarded; its body (if any) is read on its transport's demand.
        case forwarding(any UpstreamTransfer)
        /// Resolving and connecting the CONNECT destination.
        case dialing(TunnelDialer)
        case tunnel(Tunnel)
        /// An upgrade handshake, then (after `101`) the byte tunnel it became.
        case upgrading(UpgradeTransfer)
        /// A cache miss waits for another exchange fetching the same URL to store it
        /// (collapsed forwarding), since `since` (monotonic ms); polled on the timer.
        case awaitingCollapsed(since: Int)
        /// A cache hit's body streams from the disk tier as the client drains.
        case servingDisk(DiskHitStream)
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

    /// What kind of listener accepted the connection.
    enum Mode {
        /// A forward proxy: absolute-form requests and CONNECT.
        case forward
        /// A gateway route: origin-form requests appended to its upstream base URL.
        case route(ServerConfiguration.Route)
    }

    /// Stop reading from a client once this many unprocessed bytes wait (256 KiB).
    static let inputHighWatermark = ClientSocket.inputHighWatermark
    /// Resume a paused upstream once the client's output falls to this (256 KiB).
    static let outputLowWatermark = ClientSocket.outputLowWatermark

    unowned let worker: Worker
    var mode: Mode
    /// The client's socket: Sluice's own until an interception hands it to a TLS bufferevent.
    private(set) var transport: Transport
    /// The transport's buffers: what the client sent and Sluice has not consumed, and what
    /// waits to be written to it.
    private(set) var clientInput: OpaquePointer
    private(set) var clientOutput: OpaquePointer
    /// Queued in the worker's flush pass (see `scheduleFlush`).
    var flushScheduled = false
    /// Set once the connection is an intercepted CONNECT (Sluice is its TLS server).
    var interception: Interception?
    let peer: String
    /// On a route listener: what the upstream is told about this client (`Forwarded.swift`).
    let forwarding: ForwardingFields?
    var state: State = .awaitingHead
    var parser: HTTPRequestParser
    /// The idle/header timer (one event, re-armed with a purpose).
    private(set) var timer: OpaquePointer!
    private var timerPurpose: TimerPurpose = .idle
    /// The current request: its head, whether its body has been read to the end, and
    /// whether the client asked for the connection to end after it.
    var currentHead: HTTPRequestHead?
    /// The pipeline state of the current request, if it got that far.
    var exchange: Exchange?
    var requestBodyDone = true
    var wantsKeepAlive = true
    private var continueSent = false
    /// The `Proxy-Authorization` this connection last had accepted (ClientConnection+ProxyAuth).
    var acceptedCredential: AcceptedCredential?
    /// Close with a reset (SO_LINGER 0) rather than a FIN: see `transferAborted`.
    var abortiveClose = false
    /// True while `processInput` loops, so that an exchange ending synchronously inside it
    /// lets the loop go on instead of recursing (a pipelined burst must not deepen the stack).
    private var processingInput = false
    /// The exchange holds one of the worker's upstream slots (`UpstreamGate`) until it ends.
    var holdsUpstreamSlot = false
    /// The client's address as `ConnectionLimits` counted it (set by the worker at accept).
    var clientKey: ConnectionLimits.ClientKey?

    init(worker: Worker, mode: Mode, fd: Int32, peer: String, forwarding: ForwardingFields? = nil) {
        self.worker = worker
        self.mode = mode
        self.peer = peer
        self.forwarding = forwarding
        parser = HTTPRequestParser(limits: .init(worker.config.limits))
        let socket = ClientSocket(base: worker.base, fd: fd, spill: worker.readSpill)
        transport = .socket(socket)
        clientInput = socket.input
        clientOutput = socket.output
        socket.owner = self
        let me = Unmanaged.passUnretained(self).toOpaque()
        timer = event_new(
            worker.base, -1, 0,
            { _, _, arg in
                Unmanaged<ClientConnection>.fromOpaque(arg!).takeUnretainedValue().timerFired()
            }, me)
        armTimer(.idle)
    }

    /// Moves the connection onto a TLS bufferevent (interception): its callbacks point here,
    /// with the same watermarks as the plain socket's.
    func adoptTLS(_ bev: OpaquePointer) {
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

    // MARK: transport

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

    func socketReadable() { onReadable() }
    func socketDrained() { onWritable() }
    func socketClosed() { onEvent(Int16(BEV_EVENT_EOF)) }

    // MARK: libevent callbacks

    private func onReadable() {
        switch state {
        case .awaitingHead:
            if timerPurpose == .idle { armTimer(.header) }
            processInput()
        case .forwarding(let transfer):
            transfer.resumeUpload()
        case .awaitingBody(let head, let exchange):
            startWhenBodyIsValid(head, exchange)
        case .bufferingBody(let head, let exchange):
            continueBuffering(head, exchange)
        case .tunnel(let tunnel):
            tunnel.clientReadable()
        case .upgrading(let transfer):
            transfer.clientReadable()
        case .adapting, .queued, .waitingToRetry, .dialing, .awaitingCollapsed, .servingDisk, .closing, .closed:
            break  // held in the input buffer (bounded by the read watermark)
        }
    }

    private func onWritable() {
        switch state {
        case .forwarding(let transfer):
            transfer.resumeDownload()
        case .tunnel(let tunnel):
            tunnel.clientDrained()
        case .upgrading(let transfer):
            transfer.clientDrained()
        case .servingDisk(let hit):
            pumpDiskHit(hit)
        case .closing:
            if evbuffer_get_length(clientOutput) == 0 { close() }
        default:
            break
        }
    }

    private func onEvent(_ what: Int16) {
        if what & Int16(BEV_EVENT_CONNECTED) != 0 {
            interception?.established = true
            return
        }
        if what & Int16(BEV_EVENT_EOF | BEV_EVENT_ERROR) != 0 {
            if let interception, !interception.established {
                Log.warning(interception.handshakeFailure(tlsBufferevent))
            }
            if case .tunnel(let tunnel) = state {
                tunnel.clientClosed()
                return
            }
            // The client is gone (or half-closed): nothing more can be delivered, so any
            // upstream transfer is cancelled at once.
            close()
        }
    }

    private func timerFired() {
        if let interception, !interception.established {
            // Nothing can be said to a client that has not finished the TLS handshake.
            Log.warning("interception failed: no TLS handshake within \(worker.config.timeouts.clientHeader) ms from \(peer)")
            close()
            return
        }
        switch timerPurpose {
        case .idle:
            close()
        case .header:
            if case .awaitingHead = state {
                respondError(.headerTimeout(milliseconds: worker.config.timeouts.clientHeader))
            }
        case .collapsed:
            collapsedWaitTick()
        }
    }

    func armTimer(_ purpose: TimerPurpose) {
        timerPurpose = purpose
        let ms: Int
        switch purpose {
        case .idle: ms = worker.config.timeouts.clientIdle
        case .header: ms = worker.config.timeouts.clientHeader
        case .collapsed: ms = CacheStore.collapsedPollMilliseconds
        }
        var tv = timeval(tv_sec: ms / 1000, tv_usec: (ms % 1000) * 1000)
        event_add(timer, &tv)
    }

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
            let result: (consumed: Int, event: HTTPRequestParser.Event?)
            do {
                result = try parser.parse(UnsafeRawBufferPointer(start: iov.iov_base, count: iov.iov_len))
            } catch {
                evbuffer_drain(input, evbuffer_get_length(input))
                respondError(error)
                return
            }
            evbuffer_drain(input, result.consumed)
            inputConsumed()
            if case .head(let head)? = result.event {
                event_del(timer)
                handle(head)
            }
        }
    }

    private func handle(_ head: HTTPRequestHead) {
        currentHead = head
        requestBodyDone = !head.hasBody
        continueSent = false
        wantsKeepAlive = head.keepAlive && head.minorVersion == 1
        do {
            try checkLoop(head)
            let target: RequestTarget
            if head.methodIs("CONNECT") {
                if interception != nil { throw ProxyError.badURL("CONNECT inside an intercepted connection") }
                guard case .forward = mode else { throw ProxyError.notOriginForm }
                target = try RequestTarget.authority(head.target)
                guard worker.config.access.connectPorts.contains(target.port) else {
                    throw ProxyError.connectPortNotAllowed(target.port)
                }
            } else if let interception {
                target = try interception.target(for: head)
            } else {
                switch mode {
                case .forward:
                    target = try RequestTarget.absolute(head.target)
                case .route(let route):
                    guard head.bytes[head.targetRange.lowerBound] == UInt8(ascii: "/") else { throw ProxyError.notOriginForm }
                    target = try RequestTarget.absolute(route.upstream + head.target)
                }
            }
            let exchange = try beginExchange(head, target)
            try authenticate(head, exchange)
            if !head.connectionTokens.isEmpty { exchange.upgrade = allowedUpgrade(head, exchange.policy) }
            if head.methodIs("CONNECT"), exchange.policy.intercept {
                try intercept(target, exchange)
                return
            }
            if head.methodIs("CONNECT") {
                let dialer = TunnelDialer(connection: self, target: target, parent: exchange.policy.upstreamProxy)
                state = .dialing(dialer)
                dialer.start()
                return
            }
            // An upgrade handshake (WebSocket) is never answered from, or stored in, the cache.
            if let store = worker.cacheStore, exchange.policy.cache.caches, exchange.upgrade == nil,
                answerFromCache(head, exchange, store, mayWait: true)
            {
                return
            }
            prepareWhenAdmitted(head, exchange)
        } catch let error as ProxyError {
            respondError(error)
        } catch {
            respondError(.malformedRequest("\(error)"))
        }
    }

    /// Starts forwarding a chunked request once the bytes buffered so far prove its body
    /// starts validly (a first chunk, or the last chunk); until then it waits, under the
    /// header timeout. A client that promised `Expect: 100-continue` is told to go on first.
    func startWhenBodyIsValid(_ head: HTTPRequestHead, _ exchange: Exchange) {
        do {
            if try probeBufferedBody() {
                startForwarding(head, exchange)
                return
            }
        } catch {
            respondError(error)
            return
        }
        if case .awaitingBody = state { return }
        state = .awaitingBody(head, exchange)
        armTimer(.header)
        sendContinueIfExpected(head)
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
    private func probeBufferedBody() throws(ProxyError) -> Bool {
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

    /// A request that already carries this process's `Via` pseudonym has looped back here.
    private func checkLoop(_ head: HTTPRequestHead) throws {
        let pseudonym = Array(worker.viaPseudonym.utf8)
        for field in head.fields where field.name.count == 3 && head.field(field, isNamed: "via") {
            let value = head.bytes[field.value]
            if value.count >= pseudonym.count,
                (value.startIndex...(value.endIndex - pseudonym.count)).contains(where: {
                    value[$0..<($0 + pseudonym.count)].elementsEqual(pseudonym)
                })
            {
                throw ProxyError.loopDetected
            }
        }
    }

    /// Answers `error` with Sluice's own plain-text response. The connection stays open only
    /// when the error allows it and the request's body was fully read.
    func respondError(_ error: ProxyError) {
        let keep = !error.closesConnection && requestBodyDone && wantsKeepAlive && !worker.isDraining
        ResponseEncoder.error(error, close: !keep, into: clientOutput)
        scheduleFlush()
        Log.debug("\(peer): \(error.status) \(error.message)")
        if let exchange {
            exchange.summary.status = error.status
            exchange.end(.error, error: error.message)
        } else if let monitor = worker.pipeline.monitor {
            // Rejected before a request existed (unparseable): still one access-log line.
            var summary = ExchangeSummary(
                id: worker.nextRequestID(), client: peer,
                method: currentHead?.method ?? "", url: "", policy: "")
            summary.status = error.status
            summary.outcome = .error
            summary.error = error.message
            monitor.handle(.finished(summary))
        }
        if keep {
            exchangeEnded()
        } else {
            closeAfterFlush()
        }
    }

    /// Back to reading the next request, or closing, after an exchange ended cleanly.
    func exchangeEnded() {
        releaseUpstreamSlot()
        currentHead = nil
        exchange = nil
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
        releaseUpstreamSlot()
        state = .closing
        event_del(timer)
        setReading(false)
        if evbuffer_get_length(clientOutput) == 0 { close() } else { scheduleFlush() }
    }

    /// Frees the socket and cancels whatever the connection was doing upstream.
    func close() {
        switch state {
        case .closed: return
        case .forwarding(let transfer): transfer.cancel()
        case .dialing(let dialer): dialer.cancel()
        case .waitingToRetry(let timer): event_free(timer)
        case .tunnel(let tunnel): tunnel.shutdown()
        case .upgrading(let transfer): transfer.cancel()
        case .queued(let ticket): worker.upstreamGate.leave(ticket)
        default: break
        }
        releaseUpstreamSlot()
        if exchange?.circuitTry != nil { reportTryOutcome(.abandoned) }
        if let exchange, !exchange.ended {
            let tunnelled = exchange.summary.method == "CONNECT" ? exchange.summary.status == 200 : exchange.summary.status == 101
            exchange.end(tunnelled ? .tunnel : .clientAborted)
        }
        exchange = nil
        state = .closed
        event_free(timer)
        switch transport {
        case .socket(let socket):
            socket.close(abortive: abortiveClose)
        case .tls(let bev):
            if interception?.established == true { sluice_bufferevent_ssl_shutdown(bev) }
            bufferevent_free(bev)
        }
        worker.connectionClosed(self)
    }

    /// Forgets the connection without touching its bufferevent (already freed).
    func abandon() {
        state = .closed
        event_free(timer)
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

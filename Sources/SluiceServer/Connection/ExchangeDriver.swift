import CLibEvent
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// Performs what a client connection's current exchange is told — by its stages
/// (`RequestChain`) and by its `ExchangeMachine` — and hears what its transports report: the
/// session core's side of one client connection. It runs the request stages and performs
/// their answers (an error response, a stored response, a wait, a tunnel), builds each try
/// and runs it through the try stages to a transport, is that transport's delegate (the
/// response head's decisions, the cache's storing, the circuit's outcome, how the try ended)
/// and its request-body source, and keeps the timers and waits the exchange needs. Reading,
/// writing and the connection's own timers are `ClientConnection`'s.
///
/// Threading: one per client connection, owned by it, on the worker's thread.
final class ExchangeDriver: UpstreamTransferDelegate, RequestBodySource, ExchangeOwner {
    /// Interim responses forwarded to the client for the current exchange.
    private var interimsForwarded = 0

    /// What the exchange waits for, or which transfer carries it.
    enum Phase {
        /// No exchange, or none of its I/O is pending (between two of its events).
        case idle
        /// An adapter that must wait (a token fetch) has not answered yet.
        case adapting
        /// Waiting for an upstream slot of the worker (`UpstreamGate`), with this ticket.
        case queued(UInt64)
        /// A chunked request waits for its first chunk-size line, which is validated before
        /// anything is sent upstream (so a malformed body never opens an upstream connection).
        case awaitingBody
        /// A retryable request's body is being read whole, so that it can be replayed.
        case bufferingBody
        /// A try failed; the next one starts when the backoff timer fires.
        case waitingToRetry(LoopTimer<ExchangeDriver>)
        /// A request is being forwarded; its body (if any) is read on its transport's demand.
        case forwarding(any UpstreamTransfer)
        /// Resolving and connecting the CONNECT destination.
        case dialing(TunnelDialer)
        case tunnel(Tunnel)
        /// An upgrade handshake, then (after `101`) the byte tunnel it became.
        case upgrading(UpgradeTransfer)
        /// A cache miss waits on another exchange fetching the same URL (collapsed forwarding,
        /// since `Exchange.collapsedSince`; `awaited`), woken by that fetch's events.
        case awaitingCollapsed
        /// It reads that fetch's response while it is stored (shared fills, `FillReader`).
        case readingFill(FillReader)
        /// A cache hit's body streams from the disk tier as the client drains.
        case servingDisk(DiskHitStream)
        /// A try waits for its turn under the policy's `rate_limit` (`QuotaStage`), or for the
        /// fleet's trial lock of a half-open circuit (`CircuitStage`).
        case holding(TryHold)
        /// A download broke mid-body; its rest is asked for when the backoff timer fires.
        case resuming(ResumeState)
    }

    // Unowned without a check (each checked access costs a retain and a release): the
    // connection owns this driver and silences everything that could call it when it closes
    // (`cancel`); the worker outlives its connections.
    unowned(unsafe) let connection: ClientConnection
    unowned(unsafe) let worker: Worker
    /// The current request's exchange, from its admission until it ends.
    var exchange: Exchange? {
        didSet { if oldValue !== exchange { oldValue?.owner = nil } }
    }
    var phase: Phase = .idle
    /// The `max_concurrent` place the current try holds (`QuotaStage`), until the try ends.
    var quotaSlot: QuotaSlot?
    /// The current exchange's download resumption, made at its first break (`Resume`). Kept
    /// here rather than on the `Exchange`, which must stay small (it is allocated per request).
    var resume: ResumeState?
    /// The fetch of another exchange the current one waits on or reads (`CacheFetch`), its
    /// registered wake, and its reader once the body streams.
    var awaited: FetchWait?

    /// The exchange's upgrade handshake, tunnel and stored answers, each a type of its own.
    var upgrades: UpgradeExchange { UpgradeExchange(driver: self) }
    var tunnels: TunnelExchange { TunnelExchange(driver: self) }
    var stored: StoredResponses { StoredResponses(driver: self) }

    init(connection: ClientConnection, worker: Worker) {
        self.connection = connection
        self.worker = worker
    }

    // MARK: the request stages

    /// Takes a new exchange and runs its request stages.
    func start(_ exchange: Exchange) {
        exchange.owner = self
        self.exchange = exchange
        interimsForwarded = 0
        advance(exchange, from: 0)
    }

    /// Runs the request stages from the one at `index`, then performs what stopped them.
    func advance(_ exchange: Exchange, from index: Int) {
        perform(RequestChain.run(exchange, from: index, worker), exchange)
    }

    /// Performs a stage's answer (`StageVerdict`).
    func perform(_ verdict: StageVerdict, _ exchange: Exchange) {
        switch verdict {
        case .proceed:
            startFirstTry(exchange)
        case .respond(let error):
            fail(error, exchange)
        case .failTry(let error, let kind):
            transferFailed(error, kind: kind)
        case .serveStored(let answer):
            stored.serve(answer, exchange)
        case .wait(.upstreamSlot(let ticket)):
            phase = .queued(ticket)
        case .wait(.adaptation(let request)):
            adapt(request, exchange)
        case .wait(.collapsedFetch(let fetch)):
            awaitFetch(fetch)
        case .wait(.requestBody(.start)):
            startWhenBodyIsValid(exchange)
        case .wait(.requestBody(.whole)):
            connection.sendContinueIfExpected(exchange.head)
            continueBuffering(exchange)
        case .wait(.quota), .wait(.fleetTrial):
            assertionFailure("a try waits for its quota and its trial lock in startTry")
        case .tunnel(let target, intercept: true):
            do {
                try connection.intercept(target, exchange)
            } catch {
                connection.respondError(error)
            }
        case .tunnel(let target, intercept: false):
            let dialer = TunnelDialer(connection: connection, target: target, parent: exchange.policy.upstreamProxy)
            phase = .dialing(dialer)
            dialer.start()
        case .send:
            assertionFailure("a try is sent by startTry")
        }
    }

    /// Answers the client with `error`, unless a revalidation's stored response may answer
    /// instead (`stale-if-error`, or the origin's circuit is open).
    func fail(_ error: ProxyError, _ exchange: Exchange) {
        if exchange.cache?.revalidating != nil, let answer = CacheStage.staleAnswer(on: error, exchange) {
            phase = .idle
            return stored.serve(answer, exchange)
        }
        connection.respondError(error)
    }

    /// Runs the adapters; the connection holds its input until they answer.
    private func adapt(_ request: ProxyRequest, _ exchange: Exchange) {
        phase = .adapting
        AdaptersStage.run(request, exchange, worker)
    }

    /// The adapters answered (`AdaptersStage.run`).
    func adaptationAnswered(_ exchange: Exchange, _ command: ExchangeMachine.Action?) {
        guard self.exchange === exchange, case .adapting = phase else { return }
        phase = .idle
        perform(command: command, exchange)
    }

    /// A slot freed for the request waiting with `ticket` (`UpstreamSlotStage`); false when the
    /// exchange no longer waits for it (the slot is then not taken).
    func upstreamSlotGranted(_ ticket: UInt64) -> Bool {
        guard case .queued(let waiting) = phase, waiting == ticket, let exchange else { return false }
        phase = .idle
        exchange.holdsUpstreamSlot = true
        advance(exchange, from: exchange.stage + 1)
        return true
    }

    /// The request waiting with `ticket` is refused (the queue's wait ran out).
    func upstreamSlotRefused(_ ticket: UInt64, _ error: ProxyError) {
        guard case .queued(let waiting) = phase, waiting == ticket else { return }
        phase = .idle
        connection.respondError(error)
    }

    /// The exchange is over (or became a tunnel): its upstream slot goes to the next waiting
    /// request.
    func releaseUpstreamSlot() {
        releaseQuotaSlot()
        guard let exchange, exchange.holdsUpstreamSlot else { return }
        exchange.holdsUpstreamSlot = false
        worker.upstreamGate.release()
    }

    /// A collapsed miss waited `CacheStore.collapsedWaitMilliseconds` without the fetch's
    /// head: it looks again, and on a miss goes to the origin itself.
    func collapsedWaitTick() {
        guard case .awaitingCollapsed = phase, let exchange else { return }
        lookAgain(exchange)
    }

    // MARK: the request body

    /// Starts forwarding a chunked request once the bytes buffered so far prove its body
    /// starts validly (a first chunk, or the last chunk); until then it waits, under the
    /// header timeout. A client that promised `Expect: 100-continue` is told to go on first.
    func startWhenBodyIsValid(_ exchange: Exchange) {
        do {
            if try connection.probeBufferedBody() {
                phase = .idle
                advance(exchange, from: exchange.stage + 1)
                return
            }
        } catch {
            connection.respondError(error)
            return
        }
        if case .awaitingBody = phase { return }
        phase = .awaitingBody
        connection.armTimer(.header)
        connection.sendContinueIfExpected(exchange.head)
    }

    /// Reads the body into the replay buffer; the request stages go on once it is complete.
    func continueBuffering(_ exchange: Exchange) {
        var scratch = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let n: Int?
            do {
                n = try scratch.withUnsafeMutableBytes { raw in
                    try readRequestBody(into: raw.baseAddress!, capacity: raw.count)
                }
            } catch let error as ProxyError {
                return connection.respondError(error)
            } catch {
                return connection.respondError(.malformedRequest("\(error)"))
            }
            guard let n else {
                phase = .bufferingBody
                return
            }
            if n == 0 { break }
            if let reader = exchange.policy.bodyReader, exchange.body.replay == nil {
                // Past `max_body`: the adapter that must read the body cannot have it.
                return connection.respondError(.bodyTooLargeForAdapter(adapter: reader, limit: exchange.policy.maxBody))
            }
        }
        exchange.body.rewindForReplay()
        phase = .idle
        advance(exchange, from: exchange.stage + 1)
    }

    func readRequestBody(into buffer: UnsafeMutableRawPointer, capacity: Int) throws(ProxyError) -> Int? {
        guard let exchange else { return 0 }
        let connection = connection
        return try exchange.body.read(into: buffer, capacity: capacity) { (dest, max) throws(ProxyError) -> Int? in
            let n = try connection.readClientBody(into: dest, capacity: max)
            if let n { _ = exchange.machine.handle(.requestBodyRead(bytes: n)) }
            return n
        }
    }

    func rewindRequestBody() -> Bool {
        guard let exchange, exchange.body.canReplay(clientBodyDone: connection.requestBodyDone) else { return false }
        exchange.body.rewindForReplay()
        return true
    }

    /// Whether the request body could be sent again right now: there is none, or all of it
    /// was read and kept.
    func canResendBody(_ exchange: Exchange) -> Bool {
        !exchange.head.hasBody || exchange.body.canReplay(clientBodyDone: connection.requestBodyDone)
    }

    // MARK: tries

    /// Hands `event` to the exchange's machine, then performs its answer: the reports go to
    /// the monitors, then the command runs. (Commands that answer an event fed elsewhere —
    /// a try's start, a response head's disposition — are performed where it is fed.)
    func feed(_ event: ExchangeMachine.Event, _ exchange: Exchange) {
        let actions = exchange.machine.handle(event)
        exchange.report(actions)
        perform(command: actions.command, exchange)
    }

    /// Performs the machine's command between tries: adapt again, retry now or after a
    /// backoff, or answer the client.
    func perform(command: ExchangeMachine.Action?, _ exchange: Exchange) {
        guard let command else { return }
        switch command {
        case .adapt(let request):
            // A retry adapts the request again (a refreshed token).
            adapt(request, exchange)
        case .forward:
            // The adapters of the first try answered: the request stages go on after them.
            let verdict = AdaptersStage.verdict(for: command, exchange)
            if case .proceed = verdict {
                advance(exchange, from: exchange.stage + 1)
            } else {
                perform(verdict, exchange)
            }
        case .buildRetry:
            if exchange.head.hasBody { exchange.body.rewindForReplay() }
            do {
                startTry(try upstreamRequest(exchange), exchange)
            } catch {
                connection.respondError(error)
            }
        case .scheduleRetry(let delay):
            startRetryTimer(delay)
        case .fail(let error):
            fail(error, exchange)
        case .report, .beginTry, .sendResponse, .discardResponse, .checkRedirect, .followRedirect:
            assertionFailure("\(command) is performed where its event is fed")
        }
    }

    /// The request passed the request stages: its first try is built and runs the try stages.
    func startFirstTry(_ exchange: Exchange) {
        connection.stopTimer()
        connection.sendContinueIfExpected(exchange.head)
        do {
            startTry(try upstreamRequest(exchange), exchange)
        } catch {
            connection.respondError(error)
        }
    }

    /// Runs a try through the try stages (`RequestChain.attempt`) from the one at `index`; the
    /// last hands it to its transport.
    func startTry(_ request: UpstreamRequest, _ exchange: Exchange, from index: Int = 0) {
        var request = request
        let verdict = RequestChain.runTry(&request, exchange, worker, from: index)
        switch verdict {
        case .send(let route): send(request, route, exchange)
        case .wait(.quota(let wait)): hold(.quota(wait), request, exchange)
        case .wait(.fleetTrial(let origin, let ms)): hold(.trialLock(origin: origin, milliseconds: ms), request, exchange)
        default: perform(verdict, exchange)
        }
    }

    /// Holds the try until its wait ends (`TryHold`); the connection holds its input meanwhile.
    private func hold(_ kind: TryHold.Kind, _ request: UpstreamRequest, _ exchange: Exchange) {
        let hold = TryHold(kind, request: request, exchange: exchange, driver: self, worker: worker)
        phase = .holding(hold)
        hold.start()
    }

    /// A held try may go: the try stages resume at `index`.
    func holdReleased(_ hold: TryHold, _ request: UpstreamRequest, from index: Int) {
        phase = .idle
        startTry(request, hold.exchange, from: index)
    }

    /// A held try waits again, for `wait` (its turn moved, or the origin asked for a pause).
    func holdAgain(_ hold: TryHold, _ wait: QuotaWait) {
        self.hold(.quota(wait), hold.request, hold.exchange)
    }

    /// A held try may not go: the stage's answer is performed.
    func holdEnded(_ hold: TryHold, _ verdict: StageVerdict) {
        phase = .idle
        perform(verdict, hold.exchange)
    }

    /// The try's `max_concurrent` place goes to the next in line (the try ended).
    func releaseQuotaSlot() {
        guard let slot = quotaSlot else { return }
        quotaSlot = nil
        worker.rateLimits.releaseSlot(policy: slot.policy, key: slot.key, limit: slot.limit)
    }

    /// Hands a try the stages completed to its transport.
    ///
    /// `continuing` and `cacheFill`: a resume (`Resume`) carrying on the client's response in
    /// that framing, and the cache's tee it goes on feeding.
    func send(
        _ request: UpstreamRequest, _ route: UpstreamRoute, _ exchange: Exchange,
        continuing: ResponseEncoder.Framing? = nil, cacheFill: CacheFill? = nil
    ) {
        let transfer: any UpstreamTransfer
        switch route {
        case .upgrade(let upgrade, let perTryTimeout):
            let transfer = UpgradeTransfer(
                connection: connection, request: request, upgrade: upgrade,
                idleTimeout: exchange.policy.upgrades.idleTimeout, config: worker.config)
            phase = .upgrading(transfer)
            transfer.start(perTryTimeout: perTryTimeout)
            return
        case .native(let perTryTimeout):
            transfer = NativeUpstreamTransfer(
                pool: worker.nativePool, resolver: worker.resolver, delegate: self,
                bodySource: self, output: connection.clientOutput, request: request,
                clientMinorVersion: exchange.head.minorVersion,
                config: worker.config, viaLine: worker.viaLine)
            transfer.continuing = continuing
            transfer.cacheFill = cacheFill
            phase = .forwarding(transfer)
            transfer.start(perTryTimeout: perTryTimeout)
        case .curl(let perTryTimeout):
            transfer = CurlUpstreamTransfer(
                session: worker.session, delegate: self, bodySource: self,
                output: connection.clientOutput, request: request,
                clientMinorVersion: exchange.head.minorVersion,
                config: worker.config, viaLine: worker.viaLine)
            transfer.continuing = continuing
            transfer.cacheFill = cacheFill
            phase = .forwarding(transfer)
            transfer.start(perTryTimeout: perTryTimeout)
        }
    }

    /// The request for the session core: from the adapted model when there is one, else
    /// straight from the head's bytes (the fast path: no per-field strings).
    func upstreamRequest(_ exchange: Exchange) throws(ProxyError) -> UpstreamRequest {
        let head = exchange.head
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
                    forwarding: exchange.client.forwarding,
                    builder: &worker.headerBuilder),
                body: body, model: nil,
                credentials: challengeCredentials(exchange))
        }
        // Adapters rarely change the URL: the target parsed from the head is reused then.
        var request = try upstreamRequest(for: model, target: model.url == exchange.target.url ? exchange.target : nil)
        request.credentials = challengeCredentials(exchange)
        return request
    }

    /// The policy's credentials, when a challenge could be answered: answering means sending
    /// the body again, so a body must have been read whole first (within the replay limit).
    /// Otherwise the 401 goes to the client unchanged.
    func challengeCredentials(_ exchange: Exchange) -> Credentials? {
        guard let credentials = exchange.policy.credentials, canResendBody(exchange) else { return nil }
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

    /// Waits `ms` before the retry the machine scheduled; the connection holds its input meanwhile.
    func startRetryTimer(_ ms: Int) {
        let timer = LoopTimer(on: worker.base, owner: self) { $0.retryTimerFired() }
        phase = .waitingToRetry(timer)
        timer.arm(milliseconds: ms)
    }

    private func retryTimerFired() {
        guard case .waitingToRetry = phase, let exchange else { return }
        phase = .idle
        feed(.retryTimerFired, exchange)
    }

    /// Reports how the current try ended to its origin's breaker (`CircuitStage`).
    func reportTryOutcome(_ outcome: @autoclosure () -> HealthOutcome) {
        guard let exchange, exchange.circuitTry != nil else { return }
        CircuitStage.reportOutcome(outcome(), exchange, worker.health, fleet: worker.fleet)
    }

    // MARK: UpstreamTransferDelegate

    /// An origin's interim response goes to an HTTP/1.1 client at once (RFC 9110 §15.2: a
    /// proxy forwards 1xx; never to an HTTP/1.0 client). Not `100 Continue`: Sluice answers
    /// the client's `Expect` itself. Never stored: the cache sees the final response only.
    /// At most as many as the native parser takes before it calls it a flood (libcurl takes
    /// any number): the rest are dropped.
    func interimResponse(status: Int, fields: [(name: String, value: String)]) {
        guard status != 100, status != 101, case .forwarding = phase, let exchange, exchange.head.minorVersion == 1,
            interimsForwarded < HTTPResponseParser.Limits.default.interimResponses
        else { return }
        interimsForwarded += 1
        ResponseEncoder.interim(status: status, fields: fields, viaLine: worker.viaLine, into: connection.clientOutput)
        connection.scheduleFlush()
    }

    func responseStarted(status: Int) {
        connection.scheduleFlush()
        guard let exchange else { return }
        exchange.report(exchange.machine.handle(.responseHeadSent(status: status)))
    }

    func responseBodySent(bytes: Int) {
        connection.scheduleFlush()
        _ = exchange?.machine.handle(.responseBodySent(bytes: bytes))
    }

    func tryEnded(timings: TryTimings) {
        releaseQuotaSlot()
        if timings.engine == .curl, let version = timings.httpVersion, case .forwarding(let transfer) = phase,
            transfer.target.scheme == .https, let exchange, (exchange.tryPolicy ?? exchange.policy).http2 != .off
        {
            // What the origin chose when libcurl offered it h2 and http/1.1 by ALPN: the next
            // tries to it go native while it speaks HTTP/1.1 (`UpstreamEngine.choose`).
            worker.tlsProtocols.learn(
                host: transfer.target.host, port: transfer.target.port, spokeHTTP2: version == .http2,
                now: MonotonicClock.milliseconds())
        } else if timings.engine == .native, timings.httpVersion == nil, case .forwarding(let transfer) = phase,
            transfer.target.scheme == .https
        {
            worker.tlsProtocols.forget(host: transfer.target.host, port: transfer.target.port)
        }
        guard let exchange else { return }
        exchange.report(exchange.machine.handle(.tryEnded(timings)))
    }

    /// Runs the response stages on the head (`ResponseChain`), then performs their verdict:
    /// forward it, drain it for a retry, or follow a redirect.
    func responseHeadArrived(_ response: UpstreamResponseHead, on transfer: any UpstreamTransfer) {
        guard let exchange else { return transfer.forward(keepAlive: connection.keepsAliveAfterResponse) }
        var context = ResponseHeadContext(response: response, transfer: transfer, canResendBody: canResendBody(exchange))
        switch ResponseChain.runHead(&context, exchange, worker) {
        case .proceed: transfer.forward(keepAlive: connection.keepsAliveAfterResponse)
        case .discard: transfer.discard()
        case .follow(let next): follow(next, exchange, transfer)
        case .handled: return
        }
    }

    /// Follows a redirect the machine accepts, or forwards the 3xx to the client when its
    /// target cannot be requested.
    private func follow(_ next: ProxyRequest, _ exchange: Exchange, _ transfer: any UpstreamTransfer) {
        guard var request = try? upstreamRequest(for: next) else {
            exchange.report(exchange.machine.handle(.redirectTarget(usable: false)))
            return transfer.forward(keepAlive: connection.keepsAliveAfterResponse)
        }
        let actions = exchange.machine.handle(.redirectTarget(usable: true))
        exchange.report(actions)
        if case .followRedirect(keepCredentials: true)? = actions.command { request.credentials = exchange.policy.credentials }
        exchange.cache?.redirected = true
        transfer.follow(request)
    }

    func transferRedirected(to next: UpstreamRequest) {
        guard let exchange else { return }
        if next.body != .none { exchange.body.rewindForReplay() }
        startTry(next, exchange)
    }

    func transferDiscarded() {
        guard let exchange else { return }
        phase = .idle
        feed(.discardedDrained, exchange)
    }

    /// A `304` validated the stored response: the client is answered from its update.
    func transferAbsorbed() {
        phase = .idle
        guard let exchange, let answer = CacheStage.validatedAnswer(exchange) else {
            return connection.respondError(
                .upstreamProtocol(host: exchange?.target.authority ?? "", reason: "unexpected 304"))
        }
        stored.serve(answer, exchange)
    }

    func transferFinished(reusable: Bool) {
        connection.scheduleFlush()
        if let exchange { ResponseChain.runEnd(.complete, exchange, worker) }
        exchange?.end(.ok)
        connection.exchangeFinished(keepAlive: reusable)
    }

    func transferFailed(_ error: ProxyError, kind: TransportErrorKind) {
        phase = .idle
        releaseQuotaSlot()
        guard let exchange else { return connection.respondError(error) }
        ResponseChain.runEnd(.failed(error), exchange, worker)
        feed(.tryFailed(error, kind: kind, canResendBody: canResendBody(exchange)), exchange)
    }

    func transferAborted() {
        if case .forwarding(let transfer) = phase, let exchange, scheduleResume(transfer, exchange) {
            connection.scheduleFlush()  // what arrived before the break goes on to the client
            return
        }
        var framedByClose = false
        if case .forwarding(let transfer) = phase { framedByClose = transfer.framedByClose }
        endIncomplete(framedByClose: framedByClose)
    }

    /// The response started and cannot be completed: the connection ends without completing
    /// the message, and the access log says why.
    func endIncomplete(framedByClose: Bool) {
        // A body framed by the connection's end would read as complete after a FIN: the
        // client is reset instead, so that a cut is never mistaken for the end.
        if framedByClose { connection.abortiveClose = true }
        connection.scheduleFlush()
        if let exchange { ResponseChain.runEnd(.abandoned, exchange, worker) }
        exchange?.end(
            .upstreamAborted,
            error: "upstream failed after the response started"
                + (resume?.notResumed.map { "; not resumed: " + $0 } ?? ""))
        connection.closeAfterFlush()
    }
}

// MARK: the client connection's events

extension ExchangeDriver {
    /// The client sent bytes while the exchange runs: a transfer or tunnel that waits for them
    /// takes them; otherwise they wait in the input buffer (bounded by its read watermark).
    func clientReadable() {
        switch phase {
        case .forwarding(let transfer): transfer.resumeUpload()
        case .awaitingBody: if let exchange { startWhenBodyIsValid(exchange) }
        case .bufferingBody: if let exchange { continueBuffering(exchange) }
        case .tunnel(let tunnel): tunnel.clientReadable()
        case .upgrading(let transfer): transfer.clientReadable()
        case .idle, .adapting, .queued, .waitingToRetry, .dialing, .awaitingCollapsed, .servingDisk, .holding,
            .resuming, .readingFill:
            break
        }
    }

    /// The client's output drained below its low watermark.
    func clientDrained() {
        switch phase {
        case .forwarding(let transfer): transfer.resumeDownload()
        case .tunnel(let tunnel): tunnel.clientDrained()
        case .upgrading(let transfer): transfer.clientDrained()
        case .servingDisk(let hit): stored.pump(hit)
        case .readingFill: fetchMovedOn()
        default: break
        }
    }

    /// The client closed its side: true when a tunnel takes that (it finishes relaying the
    /// other way), false when the connection is to close.
    func clientClosed() -> Bool {
        guard case .tunnel(let tunnel) = phase else { return false }
        tunnel.clientClosed()
        return true
    }

    /// The connection's header timer fired while the exchange waited for the start of its
    /// body: it is answered `408` like a head that did not arrive in time.
    func headerTimerFired() {
        guard case .awaitingBody = phase else { return }
        phase = .idle
        connection.respondError(.headerTimeout(milliseconds: worker.config.timeouts.clientHeader))
    }

    /// The connection lets the exchange go without cancelling anything: its response was
    /// written (`exchangeFinished`, `closeAfterFlush`).
    func release() {
        if case .holding(let hold) = phase { hold.leave() }
        releaseUpstreamSlot()
        phase = .idle
        resume = nil
        awaited?.cancel()
        awaited = nil
    }

    /// The connection closes: whatever the exchange waits for or runs is cancelled, and its
    /// access-log line says how it ended.
    func cancel() {
        switch phase {
        case .forwarding(let transfer):
            // A shared fill goes on for its readers without this connection.
            if !handOverFill(transfer, onlyIfRead: true) { transfer.cancel() }
        case .dialing(let dialer): dialer.cancel()
        case .waitingToRetry(let timer): timer.stop()
        case .tunnel(let tunnel): tunnel.shutdown()
        case .upgrading(let transfer): transfer.cancel()
        case .queued(let ticket): worker.upstreamGate.leave(ticket)
        case .holding(let hold): hold.leave()
        case .resuming(let resume): resume.stopTimer()
        default: break
        }
        phase = .idle
        resume = nil
        awaited?.cancel()
        awaited = nil
        releaseUpstreamSlot()
        reportTryOutcome(.abandoned)
        if let exchange, !exchange.ended {
            let tunnelled = exchange.summary.method == "CONNECT" ? exchange.summary.status == 200 : exchange.summary.status == 101
            exchange.end(tunnelled ? .tunnel : .clientAborted)
        }
        exchange = nil
    }

    /// The exchange in flight, as `GET /requests` lists it; nil when there is none.
    func adminSnapshot(worker index: Int) -> AdminExchange? {
        guard let exchange, !exchange.ended else { return nil }
        let state: String
        switch phase {
        case .dialing: state = "connecting"
        case .tunnel: state = "tunnel"
        case .awaitingBody, .bufferingBody: state = "reading_body"
        case .holding(let hold) where hold.quotaWait != nil: state = "rate_limited"
        case .resuming: state = "resuming"
        default: state = exchange.inspect { $0.state.name }
        }
        return AdminExchange(exchange, state: state, worker: index)
    }

    /// `POST /requests/cancel`: the client is told (503 `request cancelled by the proxy's
    /// operator`, then the connection closes) and the upstream transfer stops. A response
    /// that already started is cut off by closing the connection (the client sees a
    /// truncated message); a tunnel is closed.
    func cancelByOperator() {
        guard let exchange, !exchange.ended else { return }
        switch phase {
        case .forwarding(let transfer):
            if transfer.responseStarted {
                exchange.end(.error, error: "cancelled by the proxy's operator after the response started")
                return connection.close()
            }
            transfer.cancel()
        case .dialing(let dialer):
            dialer.cancel()
        case .waitingToRetry(let timer):
            timer.stop()
        case .queued(let ticket):
            worker.upstreamGate.leave(ticket)
        case .holding(let hold):
            hold.leave()
            reportTryOutcome(.abandoned)
        case .tunnel:
            exchange.end(.tunnel, error: "cancelled by the proxy's operator")
            return connection.close()
        case .upgrading(let transfer):
            if transfer.phase != .awaitingAnswer && transfer.phase != .connecting {
                exchange.end(exchange.summary.status == 101 ? .tunnel : .error, error: "cancelled by the proxy's operator")
                return connection.close()
            }
            transfer.cancel()
        case .servingDisk, .resuming, .readingFill:
            if case .resuming(let resume) = phase, resume.framing == .close { connection.abortiveClose = true }
            exchange.end(.error, error: "cancelled by the proxy's operator after the response started")
            return connection.close()
        case .idle:
            return
        case .adapting, .awaitingBody, .bufferingBody, .awaitingCollapsed:
            break
        }
        phase = .idle
        connection.respondError(.cancelledByOperator)
    }
}

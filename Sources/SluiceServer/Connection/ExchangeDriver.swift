import CLibEvent
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// Carries the verdicts of a client connection's current exchange — of its stages
/// (`RequestChain`, `ResponseChain`) and of its `ExchangeMachine` — to what performs them, and
/// hears what its transports report: the session core's side of one client connection. It
/// names no stage: it runs the chains, performs their answers (an error response, a stored
/// response, a wait, a tunnel, a try handed to a transport), is each transport's delegate and
/// request-body source, and keeps the exchange's phase (what it waits for, or which transfer
/// carries it). Its parts with state or I/O of their own are types beside it: `TryHold` (a
/// try's rate-limit and trial-lock waits), `TryBuilder` (requests and transfers),
/// `RequestBodyExchange`, `UpgradeExchange`, `TunnelExchange`, `StoredResponses`,
/// `ResumeState` and `FillProducer`, `ExchangeAdmin`. Reading, writing and the connection's
/// own timers are `ClientConnection`'s.
///
/// Threading: one per client connection, owned by it, on the worker's thread.
final class ExchangeDriver: UpstreamTransferDelegate, RequestBodySource, ExchangeOwner, TryHolder {
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
    /// The current request's exchange, from its admission until it ends; this driver is its
    /// owner, unless a shared fill's producer took it over for its resumes (`FillProducer`).
    var exchange: Exchange? {
        didSet { if oldValue !== exchange, oldValue?.owner === self { oldValue?.owner = nil } }
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
    /// The current exchange's miss asking the fleet's other members (`fleet.cache`), if any.
    var peerHop: PeerHop?

    /// The exchange's upgrade handshake, tunnel and stored answers, each a type of its own.
    var upgrades: UpgradeExchange { UpgradeExchange(driver: self) }
    var tunnels: TunnelExchange { TunnelExchange(driver: self) }
    var stored: StoredResponses { StoredResponses(driver: self) }
    var bodies: RequestBodyExchange { RequestBodyExchange(driver: self) }
    var admin: ExchangeAdmin { ExchangeAdmin(driver: self) }
    var tries: TryBuilder { TryBuilder(worker: worker) }

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

    /// Performs a request stage's answer (`StageVerdict`).
    func perform(_ verdict: StageVerdict, _ exchange: Exchange) {
        switch verdict {
        case .proceed:
            startFirstTry(exchange)
        case .respond(let error):
            fail(error, exchange)
        case .serveStored(let answer):
            stored.serve(answer, exchange)
        case .wait(.upstreamSlot(let ticket)):
            phase = .queued(ticket)
        case .wait(.adaptation(let request)):
            adapt(request, exchange)
        case .wait(.collapsedFetch(let fetch)):
            awaitFetch(fetch)
        case .wait(.peers(let walk)):
            askPeers(walk, exchange)
        case .wait(.requestBody(.start)):
            bodies.startWhenValid(exchange)
        case .wait(.requestBody(.whole)):
            connection.sendContinueIfExpected(exchange.head)
            bodies.continueBuffering(exchange)
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
        }
    }

    /// Answers the client with `error`, unless a revalidation's stored response may answer
    /// instead (`stale-if-error`, or the origin's circuit is open).
    func fail(_ error: ProxyError, _ exchange: Exchange) {
        if let answer = ResponseChain.storedAnswer(replacing: error, exchange) {
            phase = .idle
            return stored.serve(answer, exchange)
        }
        connection.respondError(error)
    }

    /// Runs the adapters; the connection holds its input until they answer.
    private func adapt(_ request: ProxyRequest, _ exchange: Exchange) {
        phase = .adapting
        RequestChain.adapt(request, exchange, worker)
    }

    /// The adapters answered (`RequestChain.adapt`): the first try's request stages go on after
    /// them, a retry is built, or the client is answered.
    func adaptationAnswered(_ exchange: Exchange, _ command: ExchangeMachine.AdaptedAction?) {
        guard self.exchange === exchange, case .adapting = phase else { return }
        phase = .idle
        switch command {
        case .forward?: advance(exchange, from: exchange.stage + 1)
        case .buildRetry?: buildRetry(exchange)
        case .fail(let error)?: fail(error, exchange)
        case nil: break
        }
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
        // Through the optional, not a bound `exchange`: the binding kept it retained.
        guard exchange?.holdsUpstreamSlot == true else { return }
        exchange?.holdsUpstreamSlot = false
        worker.upstreamGate.release()
    }

    /// A collapsed miss waited `CacheStore.collapsedWaitMilliseconds` without the fetch's
    /// head: it looks again, and on a miss goes to the origin itself.
    func collapsedWaitTick() {
        guard case .awaitingCollapsed = phase, let exchange else { return }
        lookAgain(exchange)
    }

    // MARK: the request body (`RequestBodySource`; its waits are `RequestBodyExchange`'s)

    func readRequestBody(into buffer: UnsafeMutableRawPointer, capacity: Int) throws(ProxyError) -> Int? {
        guard let exchange else { return 0 }
        let connection = connection
        return try exchange.body.read(into: buffer, capacity: capacity) { (dest, max) throws(ProxyError) -> Int? in
            let n = try connection.readClientBody(into: dest, capacity: max)
            if let n { exchange.machine.requestBodyRead(bytes: n) }
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

    // MARK: between tries: the machine's answers

    /// A try failed before any response byte reached the client: the machine retries it after
    /// a backoff, or the client is answered.
    func tryFailed(_ error: ProxyError, kind: TransportErrorKind, canResendBody: Bool, _ exchange: Exchange) {
        let answer = exchange.machine.tryFailed(error, kind: kind, canResendBody: canResendBody)
        exchange.report(answer.reports)
        switch answer.command {
        case .scheduleRetry(let delay)?: startRetryTimer(delay)
        case .fail(let error)?: fail(error, exchange)
        case nil: break
        }
    }

    /// A response the machine retries was drained: the retry waits for its backoff.
    func discardedDrained(_ exchange: Exchange) {
        if let retry = exchange.machine.discardedDrained() { startRetryTimer(retry.after) }
    }

    /// Waits `ms` before the retry the machine scheduled; the connection holds its input meanwhile.
    private func startRetryTimer(_ ms: Int) {
        let timer = LoopTimer(on: worker.base, owner: self) { $0.retryTimerFired() }
        phase = .waitingToRetry(timer)
        timer.arm(milliseconds: ms)
    }

    /// The backoff ended: the request is adapted again (a refreshed token), or the retry built.
    private func retryTimerFired() {
        guard case .waitingToRetry = phase, let exchange else { return }
        phase = .idle
        switch exchange.machine.retryTimerFired() {
        case .adapt(let request)?: adapt(request, exchange)
        case .buildRetry?: buildRetry(exchange)
        case nil: break
        }
    }

    /// Builds a retry of the request (its body from the first byte) and runs it through the
    /// try stages.
    private func buildRetry(_ exchange: Exchange) {
        if exchange.head.hasBody { exchange.body.rewindForReplay() }
        do {
            startTry(try tries.request(exchange, canResendBody: canResendBody(exchange)), exchange)
        } catch {
            connection.respondError(error)
        }
    }

    // MARK: tries

    /// The request passed the request stages: its first try is built and runs the try stages.
    func startFirstTry(_ exchange: Exchange) {
        connection.stopTimer()
        connection.sendContinueIfExpected(exchange.head)
        do {
            startTry(try tries.request(exchange, canResendBody: canResendBody(exchange)), exchange)
        } catch {
            connection.respondError(error)
        }
    }

    /// Runs a try through the try stages (`RequestChain.attempt`) from the one at `index`, then
    /// performs their answer: the last hands it to its transport.
    /// `request` is consumed: it moves through the stages into its transfer, never copied (a
    /// copy is a retain per field and a release when it goes).
    func startTry(_ request: consuming UpstreamRequest, _ exchange: Exchange, from index: Int = 0) {
        let verdict = RequestChain.runTry(&request, exchange, worker, from: index)
        perform(verdict, request, exchange)
    }

    /// Performs a try stage's answer (`TryVerdict`) for `request`.
    private func perform(_ verdict: TryVerdict, _ request: consuming UpstreamRequest, _ exchange: Exchange) {
        switch verdict {
        case .send(let route):
            send(request, route, exchange)
        case .wait(let wait):
            let hold = TryHold(wait, request: request, exchange: exchange, holder: self, worker: worker)
            phase = .holding(hold)
            hold.start()
        case .respond(let error) where request.resumes != nil, .failTry(let error, _) where request.resumes != nil:
            // A resume that may not go (its circuit, its rate limit): the response ends
            // incomplete, as when a resume is refused.
            resume?.notResumed = error.message
            endIncomplete(framedByClose: resume?.framing == .close)
        case .respond(let error):
            fail(error, exchange)
        case .failTry(let error, let kind):
            transferFailed(error, kind: kind)
        case .proceed:
            fail(.malformedRequest("no transport took the request"), exchange)
        }
    }

    func takeQuotaSlot() -> QuotaSlot? { quotaSlot == nil ? nil : quotaSlot.take() }

    /// The try's `max_concurrent` place goes to the next in line (the try ended).
    func releaseQuotaSlot() {
        guard let slot = takeQuotaSlot() else { return }
        worker.rateLimits.releaseSlot(policy: slot.policy, key: slot.key, limit: slot.limit)
    }

    /// Hands a try the stages completed to its transport. A resume (`request.resumes`) carries
    /// on the client's response in its framing, and the cache's tee it goes on feeding.
    private func send(_ request: consuming UpstreamRequest, _ route: UpstreamRoute, _ exchange: Exchange) {
        if case .upgrade(let upgrade, let perTryTimeout) = route {
            let transfer = UpgradeTransfer(
                connection: connection, request: request, upgrade: upgrade,
                idleTimeout: exchange.policy.upgrades.idleTimeout, config: worker.config)
            phase = .upgrading(transfer)
            return transfer.start(perTryTimeout: perTryTimeout)
        }
        let resumes = request.resumes != nil
        guard
            let (transfer, perTryTimeout) = tries.transfer(
                request, route: route, delegate: self, bodySource: self, output: connection.clientOutput,
                clientMinorVersion: exchange.head.minorVersion)
        else { return }
        if resumes, let resume {
            transfer.continuing = resume.framing
            transfer.cacheFill = resume.takeFill()
            resume.awaitingHead = true
        }
        phase = .forwarding(transfer)
        transfer.start(perTryTimeout: perTryTimeout)
    }

    /// The current try ended outside a transfer's own report (an upgrade's answer or failure,
    /// a hold or an exchange left behind): the response stages' `end` hear how.
    func endTry(_ ending: TryEnding) {
        guard let exchange else { return }
        ResponseChain.runEnd(ending, exchange, worker)
    }

    // MARK: held tries (`TryHolder`)

    /// Whether `hold` is this driver's wait for its current exchange.
    func isHolding(_ hold: TryHold) -> Bool {
        guard exchange === hold.exchange, !hold.exchange.ended, case .holding(let current) = phase else { return false }
        return current === hold
    }

    /// A held try may go: the try stages resume at `index`.
    func holdReleased(_ hold: TryHold, _ request: UpstreamRequest, from index: Int) {
        let exchange = hold.exchange  // read first: the phase holds the hold's last reference
        phase = .idle
        startTry(request, exchange, from: index)
    }

    /// A held try may not go (or waits again): the stage's answer is performed.
    func holdEnded(_ hold: TryHold, _ verdict: TryVerdict) {
        let (request, exchange) = (hold.request, hold.exchange)  // as above: read first
        phase = .idle
        perform(verdict, request, exchange)
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
        exchange.report(exchange.machine.responseHeadSent(status: status))
    }

    func responseBodySent(bytes: Int) {
        connection.scheduleFlush()
        exchange?.machine.responseBodySent(bytes: bytes)
    }

    func tryEnded(timings: TryTimings) {
        releaseQuotaSlot()
        guard let exchange else { return }
        if case .forwarding(let transfer) = phase, transfer.target.scheme == .https {
            worker.tlsProtocols.learn(
                from: timings, target: transfer.target, http2: (exchange.tryPolicy ?? exchange.policy).http2)
        }
        exchange.report(exchange.machine.tryEnded(timings))
    }

    /// Runs the response stages on the head (`ResponseChain`), then performs their verdict
    /// (`perform(_:on:_:)`): forward it, drain it for a retry, follow a redirect, or keep its body.
    func responseHeadArrived(_ response: consuming UpstreamResponseHead, on transfer: any UpstreamTransfer) {
        guard let exchange else { return transfer.forward(keepAlive: connection.keepsAliveAfterResponse) }
        var context = ResponseHeadContext(response: response, transfer: transfer, canResendBody: canResendBody(exchange))
        perform(ResponseChain.runHead(&context, exchange, worker), on: transfer, exchange)
    }

    func transferRedirected(to next: UpstreamRequest) {
        guard let exchange else { return }
        if next.body != .none { exchange.body.rewindForReplay() }
        startTry(next, exchange)
    }

    func transferDiscarded() {
        guard let exchange else { return }
        phase = .idle
        discardedDrained(exchange)
    }

    /// A `304` validated the stored response: the client is answered from its update.
    func transferAbsorbed() {
        phase = .idle
        guard let exchange, let answer = ResponseChain.storedAnswer(replacing: nil, exchange) else {
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
        tryFailed(error, kind: kind, canResendBody: canResendBody(exchange), exchange)
    }

    func transferAborted() {
        if case .forwarding(let transfer) = phase, let exchange, resume?.awaitingHead == true {
            // A resume broke before its head: a failed try for its origin's circuit.
            ResponseChain.runEnd(.failed(.resumeBroke(transfer)), exchange, worker)
        }
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
        case .awaitingBody: if let exchange { bodies.startWhenValid(exchange) }
        case .bufferingBody: if let exchange { bodies.continueBuffering(exchange) }
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
        if peerHop != nil { peerHop = nil }  // (storing nil unconditionally costs a release call per request)
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
        peerHop = nil
        awaited?.cancel()
        awaited = nil
        releaseUpstreamSlot()
        endTry(.abandoned)
        if let exchange, !exchange.ended {
            let tunnelled = exchange.summary.method == "CONNECT" ? exchange.summary.status == 200 : exchange.summary.status == 101
            exchange.end(tunnelled ? .tunnel : .clientAborted)
        }
        exchange = nil
    }
}

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
        case waitingToRetry(OpaquePointer)
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
        /// A try waits for its turn under the policy's `rate_limit` (`QuotaStage`).
        case waitingForQuota(QuotaWaiter)
        /// A download broke mid-body; its rest is asked for when the backoff timer fires.
        case resuming(ResumeState)
    }

    /// A try held until its rate-limit turn: the timer, the try, and its place in the schedule
    /// (given back if the request leaves first). Boxed: rare, and the phase stays small.
    final class QuotaWaiter {
        /// nil while the fleet's Redis decides (its command has a timer of its own).
        let timer: OpaquePointer?
        let request: UpstreamRequest
        let wait: QuotaWait
        init(timer: OpaquePointer?, request: UpstreamRequest, wait: QuotaWait) {
            self.timer = timer
            self.request = request
            self.wait = wait
        }
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
    /// The ticket of the fleet round trip the current try waits for (`Worker.fleetWaiters`).
    private var fleetTicket: UInt64 = 0
    /// A trial waiting for the fleet's trial lock (`CircuitStage`), until it is answered.
    private var trialRequest: UpstreamRequest?
    /// The current exchange's download resumption, made at its first break (`Resume`). Kept
    /// here rather than on the `Exchange`, which must stay small (it is allocated per request).
    var resume: ResumeState?
    /// The fetch of another exchange the current one waits on or reads (`CacheFetch`), its
    /// registered wake, and its reader once the body streams.
    var awaited: FetchWait?

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
            serveStored(answer, exchange)
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
            return serveStored(answer, exchange)
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
        case .wait(.quota(let wait)): waitForQuota(request, wait)
        case .wait(.fleetTrial(let origin, let ms)): waitForTrialLock(request, origin: origin, milliseconds: ms)
        default: perform(verdict, exchange)
        }
    }

    /// A half-open circuit's trial asks the fleet for its trial lock; the connection holds
    /// its input meanwhile (at most `fleet.timeout`).
    private func waitForTrialLock(_ request: UpstreamRequest, origin: String, milliseconds: Int) {
        guard let fleet = worker.fleet else { return }
        worker.nextFleetTicket &+= 1
        let ticket = worker.nextFleetTicket
        worker.fleetWaiters[ticket] = self
        fleetTicket = ticket
        trialRequest = request
        let worker = worker
        fleet.lockTrial(origin, milliseconds: milliseconds) { [unowned(unsafe) worker] acquired in
            worker.fleetWaiters.removeValue(forKey: ticket)?.trialLockAnswered(acquired)
        }
    }

    /// The fleet's answer on the trial lock: this instance sends the trial (or Redis could not
    /// tell: it does, as alone), or another instance does and this try fails fast.
    private func trialLockAnswered(_ acquired: Bool?) {
        guard let request = trialRequest, let exchange, !exchange.ended else { return }
        trialRequest = nil
        if acquired == false {
            reportTryOutcome(.abandoned)
            SluiceMetrics.shared.recordCircuitFailedFast(origin: request.target.authority)
            return perform(.failTry(.upstreamCircuitOpen(host: request.target.authority, retryAfter: 1), kind: .other), exchange)
        }
        startTry(request, exchange, from: RequestChain.afterCircuit)
    }

    /// Holds the try until its rate-limit turn — on a timer, or in the `max_concurrent` line
    /// (with a timer for `max_wait`); the connection holds its input meanwhile.
    private func waitForQuota(_ request: UpstreamRequest, _ wait: QuotaWait) {
        let ms: Int
        switch wait.kind {
        case .timer(let delay, _):
            ms = delay
        case .slot(let ticket):
            worker.quotaWaiters[ticket] = self
            ms = Int(max(0, wait.deadline - MonotonicClock.microseconds()) / 1000)
        case .fleet:
            guard let fleet = worker.fleet else { return goOn(.proceed, request, exchange!) }
            phase = .waitingForQuota(QuotaWaiter(timer: nil, request: request, wait: wait))
            let maxWait = max(0, wait.deadline - MonotonicClock.microseconds())
            // The worker holds the waiting driver (not a weak reference: that would put a side
            // table on every driver, and slow each retain of it); leaving takes it out.
            worker.nextFleetTicket &+= 1
            let ticket = worker.nextFleetTicket
            worker.fleetWaiters[ticket] = self
            fleetTicket = ticket
            let worker = worker
            fleet.acquire(policy: wait.policy, limits: wait.settings.limits, key: wait.key, maxWait: maxWait) {
                [unowned(unsafe) worker] answer in
                worker.fleetWaiters.removeValue(forKey: ticket)?.fleetAnswered(wait, answer)
            }
            return
        }
        let timer = event_new(
            worker.base, -1, 0,
            { _, _, arg in
                Unmanaged<ExchangeDriver>.fromOpaque(arg!).takeUnretainedValue().quotaTimerFired()
            }, Unmanaged.passUnretained(self).toOpaque())!
        phase = .waitingForQuota(QuotaWaiter(timer: timer, request: request, wait: wait))
        var tv = timeval(tv_sec: ms / 1000, tv_usec: (ms % 1000) * 1000)
        event_add(timer, &tv)
    }

    /// A timer of a waiting try: its turn came, or its wait for a `max_concurrent` place ran out.
    private func quotaTimerFired() {
        guard case .waitingForQuota(let waiter) = phase, let exchange, let timer = waiter.timer else { return }
        let wait = waiter.wait
        switch wait.kind {
        case .fleet:
            return
        case .timer:
            event_free(timer)
            phase = .idle
            let now = MonotonicClock.microseconds()
            // The origin may have asked for a pause while this try waited: it waits for that
            // too, keeping the place it has (a timer that fires a little early is not a pause).
            let table = worker.rateLimits
            let held = wait.settings.learn ? table.holdRemaining(policy: wait.policy, key: wait.key, now: now) : 0
            if held > 5_000 {
                let reason = table.holdReason(policy: wait.policy, key: wait.key) ?? wait.limit
                guard now + held <= wait.deadline else {
                    table.noteWaiting(policy: wait.policy, -1)
                    let seconds = max(1, Int((held + 999_999) / 1_000_000))
                    let error = ProxyError.originRateLimited(
                        policy: wait.policy, host: exchange.target.authority, retryAfter: seconds)
                    return perform(QuotaStage.refuse(error, reason, exchange, worker), exchange)
                }
                let again = QuotaWait(
                    .timer(milliseconds: Int((held + 999) / 1000), reservation: nil), wait.limiting, key: wait.key,
                    limit: reason, since: wait.since, deadline: wait.deadline)
                return waitForQuota(waiter.request, again)
            }
            QuotaStage.waited(wait, now: now, exchange, worker)
            guard wait.scheduleAfter else { return startTry(waiter.request, exchange, from: RequestChain.afterQuota) }
            goOn(
                QuotaStage.schedule(wait.limiting, key: wait.key, now: now, deadline: wait.deadline, exchange, worker),
                waiter.request, exchange)
        case .slot(let ticket):
            if worker.rateLimits.leaveSlot(policy: wait.policy, key: wait.key, ticket: ticket) {
                worker.quotaWaiters[ticket] = nil
                event_free(timer)
                phase = .idle
                worker.rateLimits.noteWaiting(policy: wait.policy, -1)
                let limit = wait.settings.maxConcurrent ?? 0
                perform(
                    QuotaStage.refuse(.concurrencyLimited(policy: wait.policy, limit: limit), wait.limit, exchange, worker),
                    exchange)
            } else {
                // A place was given to it meanwhile: it holds it now (the wake is ignored).
                quotaSlotGranted(ticket)
            }
        }
    }

    /// A `max_concurrent` place was given to the try waiting as `ticket` (in a loop pass of
    /// the worker's own): it holds it, and goes on to the schedule of the rates.
    func quotaSlotGranted(_ ticket: UInt64) {
        worker.quotaWaiters[ticket] = nil
        guard case .waitingForQuota(let waiter) = phase, case .slot(ticket) = waiter.wait.kind, let exchange else {
            return
        }
        let wait = waiter.wait
        if let timer = waiter.timer { event_free(timer) }
        phase = .idle
        quotaSlot = QuotaSlot(policy: wait.policy, key: wait.key, limit: wait.settings.maxConcurrent ?? 1)
        let now = MonotonicClock.microseconds()
        QuotaStage.waited(wait, now: now, exchange, worker)
        goOn(
            QuotaStage.schedule(wait.limiting, key: wait.key, now: now, deadline: wait.deadline, exchange, worker),
            waiter.request, exchange)
    }

    /// The fleet's Redis decided for the try waiting with `wait` (or did not answer in time:
    /// `fleet.on_redis_down` decides then). A try that left meanwhile is not told.
    private func fleetAnswered(_ wait: QuotaWait, _ answer: FleetAnswer) {
        guard case .waitingForQuota(let waiter) = phase, waiter.wait === wait, let exchange else { return }
        phase = .idle
        let now = MonotonicClock.microseconds()
        let table = worker.rateLimits
        switch answer {
        case .go(let delay, _) where delay < 1000:
            table.count(policy: wait.policy, .allowed)
            if !exchange.summary.hasRateLimitRecord { exchange.summary.rateLimit = .allowed }
            startTry(waiter.request, exchange, from: RequestChain.afterQuota)
        case .go(let delay, _):
            table.noteWaiting(policy: wait.policy, 1)
            let limit = wait.settings.limits.map(\.description).joined(separator: " and ") + " (fleet)"
            waitForQuota(
                waiter.request,
                QuotaWait(
                    .timer(milliseconds: Int((delay + 999) / 1000), reservation: nil), wait.limiting, key: wait.key,
                    limit: table.holdReason(policy: wait.policy, key: wait.key) ?? limit, since: now,
                    deadline: wait.deadline))
        case .refuse(let retryAfter, let limit):
            // Later tries of the key are refused here until they could go.
            let maxWait = wait.deadline - wait.since
            if retryAfter > maxWait {
                table.rememberFleetDenial(
                    policy: wait.policy, key: wait.key, until: now + retryAfter - maxWait, limit: limit, now: now)
            }
            perform(
                QuotaStage.refused(wait.limiting, key: wait.key, retryAfter: retryAfter, limit: limit, exchange, worker), exchange
            )
        case .unavailable:
            guard let fleet = worker.fleet else { return }
            goOn(
                QuotaStage.fallback(wait.limiting, fleet, key: wait.key, now: now, deadline: wait.deadline, exchange, worker),
                waiter.request, exchange)
        }
    }

    /// Performs the schedule's answer for a try that had waited.
    private func goOn(_ verdict: StageVerdict, _ request: UpstreamRequest, _ exchange: Exchange) {
        switch verdict {
        case .proceed: startTry(request, exchange, from: RequestChain.afterQuota)
        case .wait(.quota(let wait)): waitForQuota(request, wait)
        default: perform(verdict, exchange)
        }
    }

    /// A waiting try leaves (the client went, or the operator cancelled it): its timer goes,
    /// its place in the schedule is given back, and a `max_concurrent` place it was given
    /// meanwhile is released.
    private func leaveQuota(_ waiter: QuotaWaiter) {
        if let timer = waiter.timer { event_free(timer) }
        let wait = waiter.wait
        let table = worker.rateLimits
        switch wait.kind {
        case .fleet:
            // Its answer will find it gone; a place the fleet gives it stays taken.
            worker.fleetWaiters[fleetTicket] = nil
            table.count(policy: wait.policy, .left)
            return
        case .timer(_, let reservation):
            table.cancel(policy: wait.policy, wait.settings, reservation)
        case .slot(let ticket):
            worker.quotaWaiters[ticket] = nil
            if !table.leaveSlot(policy: wait.policy, key: wait.key, ticket: ticket) {
                table.releaseSlot(policy: wait.policy, key: wait.key, limit: wait.settings.maxConcurrent ?? 1)
            }
        }
        table.noteWaiting(policy: wait.policy, -1)
        table.count(policy: wait.policy, .left)
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
        let timer = event_new(
            worker.base, -1, 0,
            { _, _, arg in
                Unmanaged<ExchangeDriver>.fromOpaque(arg!).takeUnretainedValue().retryTimerFired()
            }, Unmanaged.passUnretained(self).toOpaque())!
        phase = .waitingToRetry(timer)
        var tv = timeval(tv_sec: ms / 1000, tv_usec: (ms % 1000) * 1000)
        event_add(timer, &tv)
    }

    private func retryTimerFired() {
        guard case .waitingToRetry(let timer) = phase, let exchange else { return }
        event_free(timer)
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

    /// Sends the head (the plain path), drains it for a retry, or follows a redirect, as the
    /// machine decides (the answer goes to `transfer`); the machine asks only for the fields
    /// its decision needs. The cache then decides what it keeps.
    func responseHeadArrived(_ response: UpstreamResponseHead, on transfer: any UpstreamTransfer) {
        guard let exchange else { return transfer.forward(keepAlive: connection.keepsAliveAfterResponse) }
        reportTryOutcome(HealthOutcome(status: response.status))
        let head = Self.machineHead(response.collected, exchange)
        let held = exchange.tryPolicy?.rateLimiting != nil && QuotaStage.learn(response, exchange, worker)
        let actions = exchange.machine.handle(
            held
                ? .heldByOrigin(head, canResendBody: canResendBody(exchange))
                : .responseHead(head, canResendBody: canResendBody(exchange)))
        exchange.report(actions)
        switch actions.command {
        case .discardResponse?: transfer.discard()
        case .checkRedirect(let next)?: follow(next, exchange, transfer)
        default:
            if let cache = exchange.cache, CacheStage.responseHead(response, transfer, exchange, cache, worker) { return }
            transfer.forward(keepAlive: connection.keepsAliveAfterResponse)
        }
    }

    /// A final response head as the machine sees it: the status, and only the fields its
    /// decision for that status reads.
    static func machineHead(_ head: ResponseHeadCollector, _ exchange: Exchange) -> ExchangeMachine.ResponseHead {
        let fields = exchange.inspect { $0.responseFields(for: head.status) }
        return ExchangeMachine.ResponseHead(
            status: head.status,
            retryAfter: fields.contains(.retryAfter) ? head.value("retry-after") : nil,
            contentType: fields.contains(.contentType) ? head.value("content-type") : nil,
            location: fields.contains(.location) ? head.value("location") : nil)
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
        serveStored(answer, exchange)
    }

    func transferFinished(reusable: Bool) {
        connection.scheduleFlush()
        reportTryOutcome(.abandoned)
        if let exchange, exchange.cache != nil { CacheStage.responseFinished(exchange) }
        exchange?.end(.ok)
        connection.exchangeFinished(keepAlive: reusable)
    }

    func transferFailed(_ error: ProxyError, kind: TransportErrorKind) {
        phase = .idle
        releaseQuotaSlot()
        guard let exchange else { return connection.respondError(error) }
        reportTryOutcome(HealthOutcome(error: error))
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
        reportTryOutcome(.abandoned)
        exchange?.end(
            .upstreamAborted,
            error: "upstream failed after the response started"
                + (resume?.notResumed.map { "; not resumed: " + $0 } ?? ""))
        connection.closeAfterFlush()
    }
}

// MARK: upgrades, tunnels and stored responses

/// Upgrades (`upgrades:`): the handshake is an exchange like any other — adapters, the
/// machine's decisions on the answer's head (a retry, a redirect that is not followed),
/// circuit breaking (the answer's status or the failure is the try's outcome), the
/// access-log line — whose `101` turns the client connection into a byte tunnel; its line is
/// written when the tunnel ends, with status 101 and the bytes both ways. CONNECT: the
/// dialler's and the tunnel's reports. Stored responses: the cache's answers written out.
extension ExchangeDriver {
    /// The machine's view of an upgrade's answer: false when it asks for a retry (the transfer
    /// is then cancelled and the exchange goes on), else true: relay it.
    private func decide(_ head: ResponseHeadCollector, _ transfer: UpgradeTransfer, _ exchange: Exchange) -> Bool {
        reportTryOutcome(HealthOutcome(status: head.status))
        let actions = exchange.machine.handle(.responseHead(Self.machineHead(head, exchange), canResendBody: true))
        exchange.report(actions)
        switch actions.command {
        case .discardResponse?:
            let timings = transfer.timings()
            transfer.cancel()
            exchange.report(exchange.machine.handle(.tryEnded(timings)))
            phase = .idle
            feed(.discardedDrained, exchange)
            return false
        case .checkRedirect?:
            // An upgrade's redirect is the client's to follow.
            exchange.report(exchange.machine.handle(.redirectTarget(usable: false)))
            return true
        default:
            return true
        }
    }

    /// `101`: its head goes to the client and the tunnel opens. False when the try ended instead.
    func upgradeSwitched(_ head: ResponseHeadCollector, on transfer: UpgradeTransfer) -> Bool {
        guard let exchange else { return false }
        guard decide(head, transfer, exchange) else { return false }
        do {
            try ResponseEncoder.switchingProtocols(head, viaLine: worker.viaLine, into: connection.clientOutput)
        } catch {
            upgradeFailed(
                .upstreamProtocol(host: transfer.target.authority, reason: "invalid 101: \(error.reason)"),
                kind: .other, timings: transfer.timings(), cancelling: transfer)
            return false
        }
        exchange.report(exchange.machine.handle(.tryEnded(transfer.timings())))
        exchange.report(exchange.machine.handle(.responseHeadSent(status: 101)))
        exchange.monitor?.handle(
            .tunnelOpened(id: exchange.id, client: connection.peer, authority: transfer.target.authority))
        connection.wantsKeepAlive = false
        // A tunnel holds no upstream slot (`limits.max_in_flight_upstream`), as a CONNECT's
        // does not: a long-lived WebSocket must not starve the requests.
        releaseUpstreamSlot()
        connection.scheduleFlush()
        connection.setReading(true)
        return true
    }

    /// A final answer other than `101`: its head goes to the client (which the connection
    /// closes after the answer), with the framing chosen for it; nil when the try ended instead.
    func upgradeAnswered(_ head: ResponseHeadCollector, on transfer: UpgradeTransfer) -> ResponseEncoder.Framing? {
        guard let exchange else { return nil }
        guard decide(head, transfer, exchange) else { return nil }
        let framing: ResponseEncoder.Framing
        do {
            framing = try ResponseEncoder.forwardedHead(
                head, isHeadRequest: false, clientMinorVersion: 1, keepAlive: false,
                viaLine: worker.viaLine, into: connection.clientOutput)
        } catch {
            upgradeFailed(
                .upstreamProtocol(host: transfer.target.authority, reason: "invalid response head: \(error.reason)"),
                kind: .other, timings: transfer.timings(), cancelling: transfer)
            return nil
        }
        exchange.report(exchange.machine.handle(.tryEnded(transfer.timings())))
        exchange.report(exchange.machine.handle(.responseHeadSent(status: head.status)))
        connection.wantsKeepAlive = false
        connection.scheduleFlush()
        return framing
    }

    /// The non-101 answer was relayed whole.
    func upgradeAnswerFinished() {
        exchange?.end(.ok)
        connection.closeAfterFlush()
    }

    /// The non-101 answer broke off after its head reached the client.
    func upgradeAborted(reason: String) {
        exchange?.end(.upstreamAborted, error: reason)
        connection.closeAfterFlush()
    }

    /// The tunnel ended: the origin closed (`error` nil), failed, or sat idle.
    func upgradeEnded(error: String?) {
        exchange?.end(.tunnel, error: error)
        connection.closeAfterFlush()
    }

    /// The try failed before any byte reached the client: the machine decides (a retry, or
    /// Sluice's error response).
    func upgradeFailed(
        _ error: ProxyError, kind: TransportErrorKind, timings: TryTimings,
        cancelling transfer: UpgradeTransfer? = nil
    ) {
        transfer?.cancel()
        phase = .idle
        guard let exchange else { return connection.respondError(error) }
        reportTryOutcome(HealthOutcome(error: error))
        exchange.report(exchange.machine.handle(.tryEnded(timings)))
        feed(.tryFailed(error, kind: kind, canResendBody: true), exchange)
    }

    /// The CONNECT destination answered: tell the client and start relaying.
    func tunnelEstablished(fd: Int32) {
        let tunnel = Tunnel(connection: connection, upstreamFD: fd)
        phase = .tunnel(tunnel)
        if let exchange {
            exchange.summary.status = 200
            exchange.summary.attempts = 1
            exchange.monitor?.handle(
                .tunnelOpened(id: exchange.id, client: connection.peer, authority: exchange.target.authority))
        }
        ResponseEncoder.connectEstablished(into: connection.clientOutput)
        connection.scheduleFlush()
        connection.setReading(true)
        tunnel.clientReadable()  // bytes the client sent early (a TLS ClientHello) go first
    }

    /// Byte accounting for the access log's tunnel line (a CONNECT's or an upgrade's).
    func tunnelMoved(up: Int, down: Int) {
        guard let exchange else { return }
        exchange.summary.bytesIn += Int64(up)
        exchange.summary.bytesOut += Int64(down)
    }

    func tunnelFailed(_ error: ProxyError) {
        phase = .idle
        connection.respondError(error)
    }

    /// Writes a stored response (`StoredResponseWriter`) and ends the exchange, or streams its
    /// body from the disk tier as the client drains.
    func serveStored(_ answer: StoredAnswer, _ exchange: Exchange) {
        let keepAlive = connection.keepsAliveAfterResponse
        let output = connection.clientOutput
        let response = StoredResponseWriter.writeHead(
            answer, isHead: exchange.head.methodIs("HEAD"),
            range: exchange.cache.flatMap { CacheFields.value("range", in: $0.requestFields) },
            ifRange: exchange.cache.flatMap { CacheFields.value("if-range", in: $0.requestFields) },
            keepAlive: keepAlive, viaLine: worker.viaLine, into: output)
        exchange.summary.cache = answer.parameters
        exchange.summary.servedFromStore = true
        if answer.object.onDisk, !response.body.isEmpty {
            let reader =
                exchange.cache?.diskReader
                ?? worker.diskTier?.open(key: exchange.target.url, variant: answer.object.response.varyKey)
            exchange.cache?.diskReader = nil
            exchange.report(exchange.machine.handle(.responseHeadSent(status: response.status)))
            guard let reader, UInt64(answer.object.bodyLength) == reader.bodyLength else {
                return abortStoredBody(exchange, reason: "disk cache entry vanished")
            }
            var promotion: CachePromotion?
            if let taken = exchange.cache?.takePromotionToken() {
                promotion = CachePromotion(store: taken.store, url: taken.url, object: answer.object, token: taken.token)
                if promotion == nil { taken.store.memory.endFill(taken.url, taken.token) }
            }
            let hit = DiskHitStream(
                reader: reader, exchange: exchange, range: response.body, keepAlive: keepAlive, promotion: promotion)
            phase = .servingDisk(hit)
            return pumpDiskHit(hit)
        }
        let sent = StoredResponseWriter.writeBody(answer.object, response.body, into: output)
        connection.scheduleFlush()
        exchange.report(exchange.machine.handle(.responseHeadSent(status: response.status)))
        _ = exchange.machine.handle(.responseBodySent(bytes: sent))
        exchange.end(.ok)
        connection.exchangeFinished(keepAlive: keepAlive)
    }

    /// Sends the disk hit's next blocks (`StoredResponseWriter.pump`), and ends the exchange
    /// after the last. Called when the head is written and whenever the output drains.
    func pumpDiskHit(_ hit: DiskHitStream) {
        let failure = StoredResponseWriter.pump(hit, into: connection.clientOutput)
        connection.scheduleFlush()
        if let failure { return abortStoredBody(hit.exchange, reason: failure) }
        guard hit.offset >= hit.range.upperBound else { return }
        let exchange = hit.exchange
        _ = exchange.machine.handle(.responseBodySent(bytes: hit.sent))
        exchange.end(.ok)
        phase = .idle
        connection.exchangeFinished(keepAlive: hit.keepAlive)
    }

    /// A stored response's body cannot be completed (a disk block failed its digest and the
    /// entry was dropped; a shared fill broke or could not be read): the response already
    /// announced its length, so the connection is closed without completing it, and the
    /// access log says why. `warning`: logged as one (damage on disk), else at debug level
    /// (a shared fill's break was logged where it broke).
    func abortStoredBody(_ exchange: Exchange, reason: String, warning: Bool = true) {
        let line = "\(reason): \(exchange.target.url); response to \(connection.peer) aborted"
        if warning { Log.warning(line) } else { Log.debug(line) }
        exchange.summary.servedFromStore = false  // it broke: a failure, not a hit
        exchange.end(.error, error: reason + "; response aborted")
        connection.abortiveClose = true
        connection.close()
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
        case .idle, .adapting, .queued, .waitingToRetry, .dialing, .awaitingCollapsed, .servingDisk, .waitingForQuota,
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
        case .servingDisk(let hit): pumpDiskHit(hit)
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
        if case .waitingForQuota(let waiter) = phase { leaveQuota(waiter) }
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
        case .waitingToRetry(let timer): event_free(timer)
        case .tunnel(let tunnel): tunnel.shutdown()
        case .upgrading(let transfer): transfer.cancel()
        case .queued(let ticket): worker.upstreamGate.leave(ticket)
        case .waitingForQuota(let waiter): leaveQuota(waiter)
        case .resuming(let resume): resume.stopTimer()
        default: break
        }
        phase = .idle
        resume = nil
        awaited?.cancel()
        awaited = nil
        if trialRequest != nil {
            worker.fleetWaiters[fleetTicket] = nil
            trialRequest = nil
        }
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
        case .waitingForQuota: state = "rate_limited"
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
            event_free(timer)
        case .queued(let ticket):
            worker.upstreamGate.leave(ticket)
        case .waitingForQuota(let waiter):
            leaveQuota(waiter)
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

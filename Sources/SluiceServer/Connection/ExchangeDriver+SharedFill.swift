import CLibEvent
import SluiceCore

/// A request waiting on another exchange's fetch of its URL (`CacheFetch`): the fetch, the
/// wake it registered (its ticket in `Worker.fillWaiters` and its id on the fetch), and, once
/// the response is being stored, its reader.
///
/// Threading: owned by the `ExchangeDriver` on its worker's thread.
final class FetchWait {
    let fetch: CacheFetch
    unowned(unsafe) let worker: Worker
    var ticket: UInt64?
    var waitID: UInt64?
    var reader: FillReader?

    init(fetch: CacheFetch, worker: Worker) {
        self.fetch = fetch
        self.worker = worker
    }

    /// Forgets the registered wake (the request went on, or away).
    func cancel() {
        if let waitID { fetch.cancelWait(waitID) }
        if let ticket { worker.fillWaiters[ticket] = nil }
        waitID = nil
        ticket = nil
    }
}

/// Shared fills (docs/caching.md): a miss that finds another exchange fetching its URL waits
/// on that fetch without polling — woken when its head is published, its body progresses or
/// it ends — and, when the response is being stored with a known length, is sent it while it
/// arrives (read-while-writer): its head at once, its body from the fill's disk file or memory
/// chunks as they are written, at its own client's pace. A fetch that ends without storing
/// anything sends it to look up again (then, as before, to the origin itself); one that breaks
/// after its body started ends this response incomplete, as it ends the fetching one.
extension ExchangeDriver {
    /// Waits on `fetch` (`.wait(.collapsedFetch)`): its head must come within
    /// `CacheStore.collapsedWaitMilliseconds`.
    func awaitFetch(_ fetch: CacheFetch) {
        awaited?.cancel()
        awaited = FetchWait(fetch: fetch, worker: worker)
        phase = .awaitingCollapsed
        connection.armTimer(.collapsed)
        fetchMovedOn()
    }

    /// The fetch moved on (or the request just began waiting, or its client drained): acts on
    /// what it is now, and registers for the next event when there is nothing to do.
    func fetchMovedOn() {
        while let wait = awaited, let exchange {
            wait.cancel()  // one registration at a time: a drain may call before the wake
            let snapshot = wait.fetch.snapshot
            var seen: (phase: CacheFetch.Phase, available: Int64, until: Int64) = (.fetching, 0, .max)
            switch phase {
            case .awaitingCollapsed:
                switch snapshot.phase {
                case .fetching:
                    seen = (.fetching, 0, .max)
                case .streaming:
                    guard let stream = snapshot.stream as? FillStream, Self.mayRead(stream, exchange) else {
                        // Not an answer for this request (another Vary variant, a response
                        // that must be validated first): it goes on by itself.
                        return lookAgain(exchange)
                    }
                    if startReading(wait, stream, exchange) { continue }
                    seen = (.streaming, .max, .max)  // unreadable (just committed): look again at its end
                case .ended:
                    return lookAgain(exchange)
                }
            case .readingFill(let reader):
                guard let next = pumpFill(reader, snapshot, exchange) else { return }
                seen = next
            default:
                return
            }
            let ticket = worker.nextFillTicket
            worker.nextFillTicket += 1
            let handle = worker.stopHandle
            worker.fillWaiters[ticket] = self
            if let id = wait.fetch.wait(
                seen: seen.phase, available: seen.available, until: seen.until,
                wake: { Worker.wakeFillWaiter(handle, ticket) })
            {
                wait.ticket = ticket
                wait.waitID = id
                return
            }
            worker.fillWaiters[ticket] = nil  // it moved on meanwhile: look again now
        }
    }

    /// The head never came within the wait (the collapsed timer), or the fetch ended: the
    /// lookup runs again, without waiting this time.
    func lookAgain(_ exchange: Exchange) {
        awaited?.cancel()
        awaited = nil
        phase = .idle
        advance(exchange, from: exchange.stage)
    }

    /// Whether the response being stored may answer this request as a stored response would
    /// (`CacheLookup`: its `Vary` fields match, it is fresh, nothing asks for validation).
    static func mayRead(_ stream: FillStream, _ exchange: Exchange) -> Bool {
        let head = exchange.head
        let fields = head.fields.map { (name: head.name($0), value: head.value($0)) }
        let decision = CacheLookup.decide(
            method: "GET", requestFields: fields, candidates: [stream.response], now: CacheStage.wallClockSeconds(),
            modification: exchange.policy.cache.modification)
        if case .serve = decision { return true }
        return false
    }

    /// The response is being stored: this request's head goes out now and its body follows
    /// from the fill. False when the fill's source cannot be opened (the caller waits for the
    /// fetch's end and looks up again).
    private func startReading(_ wait: FetchWait, _ stream: FillStream, _ exchange: Exchange) -> Bool {
        // A length not known yet: chunked to an HTTP/1.1 client, up to the close to HTTP/1.0.
        let framing: ResponseEncoder.Framing =
            stream.contentLength != nil ? .length : exchange.head.minorVersion >= 1 ? .chunked : .close
        let keepAlive = framing != .close && connection.keepsAliveAfterResponse
        guard
            let reader = FillReader(
                fetch: wait.fetch, stream: stream, exchange: exchange, keepAlive: keepAlive, framing: framing)
        else {
            return false
        }
        connection.stopTimer()
        let head = exchange.head
        let fields = head.fields.map { (name: head.name($0), value: head.value($0)) }
        let now = CacheStage.wallClockSeconds()
        let answer = StoredAnswer(
            object: CacheObject(response: stream.response, diskLength: Int(stream.contentLength ?? 0)),
            parameters: "hit; collapsed; detail=shared-fill",
            age: CacheFreshness.currentAge(of: stream.response, now: now),
            notModified: CacheConditional.notModified(fields, stored: stream.response))
        let sent = StoredResponseWriter.writeHead(
            answer, isHead: false, range: nil, keepAlive: keepAlive, viaLine: worker.viaLine,
            unknownLength: framing == .length ? nil : framing, into: connection.clientOutput)
        exchange.summary.cache = answer.parameters
        exchange.summary.servedFromStore = true
        exchange.reportCache(.hit(age: answer.age, notModified: answer.notModified))
        exchange.report(exchange.machine.responseHeadSent(status: sent.status))
        connection.scheduleFlush()
        if sent.body.isEmpty {
            // A 304 for the client's conditional: nothing of the body to wait for.
            return finishFillRead(exchange, keepAlive: keepAlive)
        }
        wait.reader = reader
        reader.started()
        phase = .readingFill(reader)
        return true
    }

    /// Sends what the fill holds beyond the reader's offset; returns what to wait for next
    /// (nil: nothing — the response ended, or the client's output is full and its drain
    /// calls again).
    private func pumpFill(
        _ reader: FillReader, _ snapshot: CacheFetch.Snapshot, _ exchange: Exchange
    ) -> (phase: CacheFetch.Phase, available: Int64, until: Int64)? {
        let length = reader.stream.contentLength ?? .max
        let available = min(snapshot.available, length)
        let output = connection.clientOutput
        guard let moved = reader.pump(available: available, into: output, bound: StoredResponseWriter.diskOutputBound)
        else {
            stored.abort(exchange, reason: "the shared fill's body could not be read", warning: false)
            return nil
        }
        if moved > 0 {
            connection.scheduleFlush()
            exchange.machine.responseBodySent(bytes: moved)
        }
        if reader.offset >= length {
            finishFillRead(exchange, keepAlive: reader.keepAlive)
            return nil
        }
        if reader.offset < available { return nil }  // the output is full: its drain calls again
        if case .ended(let complete) = snapshot.phase {
            guard complete, reader.stream.contentLength == nil else {
                stored.abort(exchange, reason: "the shared fill ended before its body was whole", warning: false)
                return nil
            }
            // A body of unknown length ends with its fill.
            if reader.framing == .chunked { ResponseEncoder.lastChunk(into: output) }
            connection.scheduleFlush()
            finishFillRead(exchange, keepAlive: reader.keepAlive)
            return nil
        }
        // Woken a step further on (or at the end), not for every block the fill stores.
        return (.streaming, reader.offset, min(reader.offset + Self.fillReadStep, length))
    }

    /// A reader that caught up with a fill is woken when this much more is stored (1 MiB).
    static let fillReadStep: Int64 = 1 << 20

    @discardableResult
    private func finishFillRead(_ exchange: Exchange, keepAlive: Bool) -> Bool {
        awaited?.cancel()
        awaited = nil
        exchange.end(.ok)
        phase = .idle
        connection.exchangeFinished(keepAlive: keepAlive)
        return true
    }

}

/// The rest of a shared fill's origin transfer once its own client no longer takes it
/// directly: the client fell behind (it reads the fill like the other readers now) or went
/// away. It keeps the exchange's cache part (the fill and the fetch claim) and finishes the fill
/// at the origin's pace: a complete response is stored and its readers told. An origin that
/// breaks mid-body is asked for the rest, as the client's own exchange would have
/// (`Resume`, `ResumeState`): after the backoff a continuing try (`Range`, `If-Range`) goes on
/// into the fill; one that cannot carry the body on ends the readers incomplete. Held by its
/// worker (`Worker.fillProducers`) until the transfer ends.
///
/// Threading: the worker's thread (its transfer's events).
final class FillProducer: UpstreamTransferDelegate, RequestBodySource, TryHolder {
    private(set) var transfer: any UpstreamTransfer
    /// The exchange whose client left (its record ended): its cache part (the fill and the
    /// fetch claim), and what its resumes' try stages read (the policy, the circuit's and the
    /// rate limit's state). The producer becomes its owner for its resumes' waits and places.
    let exchange: Exchange
    let cache: CacheExchange
    unowned(unsafe) let worker: Worker
    /// The download's resumption, when the response may be resumed (nil: a break ends it).
    private let resume: ResumeState?
    /// What a continuing try writes besides the fill: nothing (it is detached), but a transfer
    /// needs an output; made on the first resume.
    private var scratch: OpaquePointer?
    /// A resume waiting for its turn (`rate_limit`, the fleet's trial lock).
    private var hold: TryHold?
    /// The `max_concurrent` place a resume holds until it ends.
    var quotaSlot: QuotaSlot?

    init(transfer: any UpstreamTransfer, exchange: Exchange, cache: CacheExchange, worker: Worker, resume: ResumeState?) {
        self.transfer = transfer
        self.exchange = exchange
        self.cache = cache
        self.worker = worker
        self.resume = resume
    }

    deinit {
        resume?.stopTimer()
        if let scratch { evbuffer_free(scratch) }
    }

    /// The fill ends: complete (stored, its readers told) or not; the try's place and circuit
    /// outcome are settled (`ending`), and the exchange is let go.
    private func finish(complete: Bool, _ ending: TryEnding = .abandoned) {
        resume?.stopTimer()
        hold?.leave()
        hold = nil
        if let fill = cache.fill {
            cache.fill = nil
            if complete { _ = fill.complete() }
        }
        cache.endFetch(complete: complete)
        if exchange.owner === self {
            ResponseChain.runEnd(ending, exchange, worker)
            exchange.owner = nil
        }
        worker.fillProducers[ObjectIdentifier(self)] = nil
    }

    /// Stops the transfer, or the resume waiting for its backoff or its turn (the worker stops).
    func cancel() {
        resume?.stopTimer()
        hold?.leave()
        hold = nil
        if exchange.owner === self { exchange.owner = nil }  // it holds this producer
        transfer.cancel()
    }

    func transferFinished(reusable: Bool) { finish(complete: true) }
    func transferAborted() {
        // A resume that broke before its head is a failed try for its origin's circuit.
        if resume?.awaitingHead == true, exchange.owner === self {
            ResponseChain.runEnd(.failed(.resumeBroke(transfer)), exchange, worker)
        }
        if !scheduleResume() { finish(complete: false) }
    }
    func transferFailed(_ error: ProxyError, kind: TransportErrorKind) {
        // A resume's own request failed before its head: its circuit hears it, and it may be
        // tried again.
        if exchange.owner === self { ResponseChain.runEnd(.failed(error), exchange, worker) }
        if resume?.awaitingHead == true, scheduleResume() { return }
        finish(complete: false)
    }
    func transferRedirected(to next: UpstreamRequest) { finish(complete: false) }
    func transferDiscarded() { finish(complete: false) }
    func transferAbsorbed() { finish(complete: false) }
    // A fill's policy stores responses: none of its bodies is kept for a script.
    func transferCollected(_ head: UpstreamResponseHead, body: [UInt8]) { finish(complete: false) }
    func collectionOverflowed(_ head: UpstreamResponseHead, on transfer: any UpstreamTransfer) {
        transfer.forward(keepAlive: false)
    }
    func responseHeadArrived(_ head: consuming UpstreamResponseHead, on transfer: any UpstreamTransfer) {
        transfer.forward(keepAlive: false)
    }
    func interimResponse(status: Int, fields: [(name: String, value: String)]) {}
    func responseStarted(status: Int) {}
    func responseBodySent(bytes: Int) {}
    func tryEnded(timings: TryTimings) {}
    func clientFellBehind(_ transfer: any UpstreamTransfer) -> Bool { true }

    /// A resume's head carries the fill on only as the rest of the same representation; the
    /// response stages of a continuation hear it first (its status is its try's outcome).
    func continuationArrived(_ head: UpstreamResponseHead) -> Bool {
        var context = ResponseHeadContext(response: head, transfer: transfer, canResendBody: true)
        if exchange.owner === self { ResponseChain.runContinuation(&context, exchange, worker) }
        return resume?.answered(head) ?? false
    }

    // A continuing try is a GET: no body.
    func readRequestBody(into buffer: UnsafeMutableRawPointer, capacity: Int) throws(ProxyError) -> Int? { 0 }
    func rewindRequestBody() -> Bool { true }

    /// The origin broke: true when the rest was scheduled (after the backoff).
    private func scheduleResume() -> Bool {
        guard let resume, let delay = resume.broke(transfer) else { return false }
        resume.arm(delay, on: worker.base, owner: self) { $0.resumeTimerFired() }
        return true
    }

    /// The backoff ended: the rest of the body is asked for, into the fill alone.
    private func resumeTimerFired() {
        guard let resume else { return }
        resume.stopTimer()
        SluiceMetrics.shared.recordTry(.fillResume)
        // The producer owns the exchange for its resumes (their waits, their places); its
        // client's driver, which may still read the fill, performs nothing of theirs.
        exchange.owner = self
        startTry(resume.continuingRequest())
    }

    /// Runs a resume through the try stages (`RequestChain.attempt`) from the one at `index`,
    /// as the exchange's own tries run (its circuit, its `rate_limit` turn, the adapters of every
    /// try), then performs their answer.
    private func startTry(_ request: UpstreamRequest, from index: Int = 0) {
        var request = request
        perform(RequestChain.runTry(&request, exchange, worker, from: index), request)
    }

    private func perform(_ verdict: TryVerdict, _ request: UpstreamRequest) {
        switch verdict {
        case .send(let route):
            send(request, route)
        case .wait(let wait):
            let hold = TryHold(wait, request: request, exchange: exchange, holder: self, worker: worker)
            self.hold = hold
            hold.start()
        case .respond(let error), .failTry(let error, _):
            // The circuit or the rate limit keeps the resume back: the readers end incomplete.
            resume?.notResumed = error.message
            finish(complete: false)
        case .proceed:
            finish(complete: false)
        }
    }

    /// Hands the resume to its transport; it writes into the fill alone.
    private func send(_ request: UpstreamRequest, _ route: UpstreamRoute) {
        guard let resume else { return finish(complete: false) }
        let output = scratch ?? evbuffer_new()!
        scratch = output
        guard
            let (next, perTryTimeout) = TryBuilder(worker: worker).transfer(
                request, route: route, delegate: self, bodySource: self, output: output, clientMinorVersion: 1)
        else { return finish(complete: false) }
        next.continuing = resume.framing
        next.cacheFill = resume.takeFill()
        next.detach(to: self)
        resume.awaitingHead = true
        transfer = next
        next.start(perTryTimeout: perTryTimeout)
    }

    // MARK: `TryHolder` (a resume waiting for its turn)

    func isHolding(_ hold: TryHold) -> Bool { self.hold === hold }

    func holdReleased(_ hold: TryHold, _ request: UpstreamRequest, from index: Int) {
        // This producer held the hold's last reference, and its own callback called: kept alive.
        withExtendedLifetime(hold) {
            self.hold = nil
            startTry(request, from: index)
        }
    }

    func holdEnded(_ hold: TryHold, _ verdict: TryVerdict) {
        withExtendedLifetime(hold) {
            self.hold = nil
            perform(verdict, hold.request)
        }
    }

    func takeQuotaSlot() -> QuotaSlot? { quotaSlot == nil ? nil : quotaSlot.take() }

    // The producer's tries pass the try stages only: the request stages' waits are not theirs.
    func adaptationAnswered(_ exchange: Exchange, _ command: ExchangeMachine.AdaptedAction?) {}
    func upstreamSlotGranted(_ ticket: UInt64) -> Bool { false }
    func upstreamSlotRefused(_ ticket: UInt64, _ error: ProxyError) {}
}

extension ExchangeDriver {
    /// Hands the transfer of a shared fill to a `FillProducer` (the fill goes on without this
    /// connection); false when the transfer's body is not a shared fill (`onlyIfRead`: or
    /// nobody else reads it).
    func handOverFill(_ transfer: any UpstreamTransfer, onlyIfRead: Bool = false) -> Bool {
        guard let exchange, let cache = exchange.cache, let fill = cache.fill, transfer.cacheFill === fill,
            onlyIfRead ? fill.othersWantItsBody : fill.sharesItsBody
        else { return false }
        // The download may be resumed by the producer if its origin breaks (a resume that
        // already happened carries its state over).
        let resumable = resumeState(transfer, exchange)
        let producer = FillProducer(transfer: transfer, exchange: exchange, cache: cache, worker: worker, resume: resumable)
        worker.fillProducers[ObjectIdentifier(producer)] = producer
        transfer.detach(to: producer)
        return true
    }

    /// The fetching client fell behind its own shared fill: it becomes one of the fill's
    /// readers from the bytes it has, and the transfer goes on at the origin's pace for every
    /// reader (a slow first client slows nobody else).
    func clientFellBehind(_ transfer: any UpstreamTransfer) -> Bool {
        guard let exchange, let fetch = exchange.cache?.fill?.publishedFetch,
            let stream = fetch.snapshot.stream as? FillStream,
            let reader = FillReader(
                fetch: fetch, stream: stream, exchange: exchange,
                keepAlive: transfer.clientFraming != .close && connection.keepsAliveAfterResponse,
                framing: transfer.clientFraming,
                // What the client has: a resumed download's earlier tries' bytes too.
                offset: (resume?.base ?? 0) + transfer.bodyBytesSent)
        else { return false }
        guard handOverFill(transfer) else { return false }
        let wait = FetchWait(fetch: fetch, worker: worker)
        wait.reader = reader
        reader.started()
        awaited = wait
        phase = .readingFill(reader)
        return true
    }
}

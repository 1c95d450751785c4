import CLibEvent
import HTTPTypes
import SluiceCore

/// A download that may be resumed (`Resume`, docs/configuration.md "Resumable downloads"):
/// the response's `DownloadResumption`, the try it came from (resumes go to the same origin,
/// over the same engine, with the same request plus `Range` and `If-Range`), and, while a
/// resume waits for its backoff, the timer and what the next try carries on (the client's
/// framing, the cache's tee). Held by the `ExchangeDriver` (the `Exchange` stays small).
///
/// Threading: owned by its exchange, on the worker's thread.
final class ResumeState {
    var resumption: DownloadResumption
    let request: UpstreamRequest
    let route: UpstreamRoute
    /// Why the last resume could not carry the body on.
    var refusal: String?
    /// Why the response ended incomplete after all (for the access log's error).
    var notResumed: String?
    /// The body offset the current try started at (0 for the first).
    var base: Int64 = 0
    /// A resume was sent and its head has not been judged yet.
    var awaitingHead = false
    /// While waiting for the backoff: the timer, the fields the resume sends, the framing to
    /// keep, the cache's tee.
    var timer: LoopEvent?
    var fields: [(name: String, value: String)] = []
    var framing: ResponseEncoder.Framing = .none
    var fill: CacheFill?

    init(resumption: DownloadResumption, request: UpstreamRequest, route: UpstreamRoute) {
        self.resumption = resumption
        self.request = request
        self.route = route
    }

    /// Frees the backoff timer (it fired, or the connection closed while it waited: its
    /// callback's driver must not be called after that).
    func stopTimer() {
        timer?.stop()
        timer = nil
    }

    deinit { stopTimer() }

    /// The upstream of `transfer` broke: the delay before the rest is asked for, with the
    /// state the next try needs (its offset, fields, framing, the cache's tee taken from the
    /// broken transfer); nil when it may not be (`notResumed` says why).
    func broke(_ transfer: any UpstreamTransfer) -> Int? {
        guard !transfer.deadlineExceeded else { return nil }
        if awaitingHead {
            awaitingHead = false
            SluiceMetrics.shared.recordResume(.failed)  // the resume's own request failed before its head
        }
        if let refusal {
            notResumed = refusal
            return nil
        }
        let offset = base + transfer.bodyBytesSent
        switch resumption.broke(at: offset) {
        case .giveUp(let reason):
            if resumption.offsets.count >= resumption.limit { SluiceMetrics.shared.recordResume(.exhausted) }
            notResumed = reason
            return nil
        case .resume(let delay, let fields):
            base = offset
            self.fields = fields
            framing = transfer.clientFraming
            fill = transfer.cacheFill
            transfer.cacheFill = nil
            Log.debug(
                "upstream \(transfer.target.authority) broke at body byte \(offset) of \(request.target.url); resuming in \(delay) ms"
            )
            return delay
        }
    }

    /// The cache's tee the next try goes on feeding (taken once).
    func takeFill() -> CacheFill? {
        defer { fill = nil }
        return fill
    }

    /// Arms the backoff timer on `base`: `fired` runs when it ends, given `owner` (which holds
    /// this state).
    func arm<Owner: AnyObject>(
        _ delay: Int, on base: OpaquePointer, owner: Owner, _ fired: @escaping (Owner) -> Void
    ) {
        let timer = LoopTimer(on: base, owner: owner, fired)
        self.timer = timer
        timer.arm(milliseconds: delay)
    }

    /// The next try: the same request with its own `Range` and `If-Range` (the client's range
    /// and conditionals dropped), to the same origin over the same engine (`resumes`). Its
    /// model gets the same fields, so that adapters that run on every try (a signer) cover them.
    func continuingRequest() -> UpstreamRequest {
        var next = request
        next.headers = next.headers.replacing(ResumeState.droppedFields, adding: fields)
        next.resumes = route
        if var model = next.model {
            for name in ResumeState.droppedFields { model.headerFields[HTTPField.Name(name)!] = nil }
            for (name, value) in fields { model.headerFields.append(HTTPField(name: HTTPField.Name(name)!, value: value)) }
            next.model = model
        }
        return next
    }

    /// The request fields a resume does not repeat: the client's own range and conditionals
    /// (the resume sends its own `Range` and `If-Range`).
    static let droppedFields = [
        "range", "if-range", "if-match", "if-none-match", "if-modified-since", "if-unmodified-since",
    ]

    /// A resume's head: true when it carries the body on as the rest of the same
    /// representation; else the refusal is kept and the response (or fill) ends incomplete.
    func answered(_ head: UpstreamResponseHead) -> Bool {
        awaitingHead = false
        if let refusal = resumption.answered(
            status: head.status, contentRange: head.value("content-range"),
            contentLength: head.value("transfer-encoding") == nil ? head.value("content-length") : nil,
            etag: head.value("etag"), lastModified: head.value("last-modified"))
        {
            self.refusal = refusal
            SluiceMetrics.shared.recordResume(.refused)
            Log.info("resume of \(request.target.url) refused: \(refusal); the response ends incomplete")
            return false
        }
        SluiceMetrics.shared.recordResume(.resumed)
        return true
    }
}

/// Resumable downloads: when the upstream of a `200` to a `GET` breaks after the response
/// started, and the response had a strong validator, the rest is asked for after a backoff
/// (`Range: bytes=N-`, `If-Range`) and streamed on to the client in the framing its head
/// announced; a `206` that is not the rest of the same representation ends the response
/// incomplete. The client sees one response; the access log says `resumed` with the offsets.
extension ExchangeDriver {
    /// The state of a response whose upstream just broke, made on its first break: nil when
    /// it may not be resumed (not a `200` to a `GET`, no strong validator, `resume: false`).
    /// Made only then, so that the plain path pays nothing for it.
    func resumeState(_ transfer: any UpstreamTransfer, _ exchange: Exchange) -> ResumeState? {
        if let resume = self.resume { return resume }
        guard transfer.continuing == nil, let response = transfer.forwardedHead, response.status == 200,
            exchange.summary.method == "GET", let (request, route) = transfer.resumableTry,
            (exchange.tryPolicy ?? exchange.policy).resume,
            let validator = Resume.validator(
                etag: response.value("etag"), lastModified: response.value("last-modified"), date: response.value("date"))
        else { return nil }
        if case .upgrade = route { return nil }
        let total =
            response.value("transfer-encoding") == nil ? response.value("content-length").flatMap { Int64($0) } : nil
        let resume = ResumeState(
            resumption: DownloadResumption(
                validator: validator, total: total, retry: (exchange.tryPolicy ?? exchange.policy).retryPolicy),
            request: request, route: route)
        self.resume = resume
        return resume
    }

    /// The upstream broke after the response started: true when a resume was scheduled (the
    /// exchange goes on), false when the response must end incomplete.
    func scheduleResume(_ transfer: any UpstreamTransfer, _ exchange: Exchange) -> Bool {
        guard let resume = resumeState(transfer, exchange), let delay = resume.broke(transfer) else { return false }
        phase = .resuming(resume)
        resume.arm(delay, on: worker.base, owner: self) { $0.resumeTimerFired() }
        return true
    }

    /// The backoff ended: the rest of the body is asked for, by a try that passes the try
    /// stages like any other (its circuit, its `rate_limit` turn, the adapters of every try).
    func resumeTimerFired() {
        guard case .resuming(let resume) = phase, let exchange else { return }
        resume.stopTimer()
        phase = .idle
        var request = resume.continuingRequest()
        if let total = worker.config.timeouts.total {
            // `timeouts.total` is the whole exchange's: a resume gets what is left of it.
            let left = total - exchange.inspect { $0.elapsed }
            guard left > 0 else {
                resume.notResumed = "timeouts.total ran out"
                return endIncomplete(framedByClose: resume.framing == .close)
            }
            request.totalTimeout = left
        }
        SluiceMetrics.shared.recordTry(.resume)
        startTry(request, exchange)
    }

    /// A resume's head: it carries the body on only as the rest of the same representation.
    /// The response stages of a continuation hear it first (its status is its try's outcome).
    func continuationArrived(_ head: UpstreamResponseHead) -> Bool {
        guard let exchange, let resume = self.resume, case .forwarding(let transfer) = phase else { return false }
        var context = ResponseHeadContext(response: head, transfer: transfer, canResendBody: true)
        ResponseChain.runContinuation(&context, exchange, worker)
        guard resume.answered(head) else { return false }
        exchange.summary.resumedAt = resume.resumption.acceptedOffsets
        return true
    }
}

extension ProxyError {
    /// What a resume that broke before its head tells its origin's circuit (a failed try).
    static func resumeBroke(_ transfer: any UpstreamTransfer) -> ProxyError {
        .upstreamProtocol(host: transfer.target.authority, reason: "the resume broke before its head")
    }
}

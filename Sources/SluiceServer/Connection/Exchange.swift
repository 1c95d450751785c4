import SluiceCore

/// The pipeline state of one client request, across its upstream tries and redirect hops.
///
/// Holds the worker's pipeline as it was when the request arrived, so a reload never changes
/// a request midway. Owned by its `ClientConnection`, on the worker's thread.
final class Exchange {
    let id: UInt64
    let pipeline: WorkerPipeline
    let policy: HostPolicy
    /// The host `policy` was matched for.
    let policyHost: String
    /// The `Host` the origin gets when an `upstream:` override changed the port (the client's),
    /// for tries to `target` only (not for a redirect elsewhere).
    var hostHeader: (value: String, target: RequestTarget)?
    var summary: ExchangeSummary
    /// The request as the pipeline sees it (built when adapters, monitors or redirects need it).
    var model: ProxyRequest?
    /// The request before adaptation: a retry adapts it again (a refreshed token).
    var originalModel: ProxyRequest?
    /// Set instead of `model` when the policy's adapters are all fixed header edits.
    var headerEdits: HeaderEditPlan?
    var hops = 0
    let body: RequestBodyReader
    /// The last upstream request sent, kept to derive a redirect's next request.
    var target: RequestTarget
    var ended = false
    /// Retries made so far (0 during the first try).
    var retryCount = 0
    /// The delay of the retry just decided, for the timer that starts it.
    var pendingRetryDelay = 0
    private let startedAt = MonotonicClock.milliseconds()

    var elapsedMilliseconds: Int { MonotonicClock.milliseconds() - startedAt }

    init(id: UInt64, pipeline: WorkerPipeline, policy: HostPolicy, summary: ExchangeSummary,
         target: RequestTarget, body: RequestBodyReader) {
        self.id = id
        self.pipeline = pipeline
        self.policy = policy
        policyHost = target.host
        self.summary = summary
        self.target = target
        self.body = body
    }

    var monitor: (any EventMonitor)? { pipeline.monitor }

    /// Sends `.finished` (once) with the outcome.
    func end(_ outcome: Outcome, error: String? = nil) {
        guard !ended else { return }
        ended = true
        summary.outcome = outcome
        if let error { summary.error = error }
        monitor?.handle(outcome == .tunnel ? .tunnelClosed(summary) : .finished(summary))
    }
}

/// A worker's copy of the pipeline: the shared, immutable policies plus this worker's own
/// monitor instances (whose buffers only this thread touches).
final class WorkerPipeline {
    let policies: PolicyTable
    let redactor: Redactor
    /// nil when no monitor is configured, so the hot path can skip building events.
    let monitor: (any EventMonitor)?
    /// When this worker started using the snapshot, if it replaced another (a reload): TLS
    /// connections opened before then were verified under the previous trust settings and
    /// are not reused for this snapshot's requests.
    let reloadedAt: Int?

    init(_ pipeline: Pipeline, reload: Bool = false) {
        reloadedAt = reload ? MonotonicClock.milliseconds() : nil
        policies = pipeline.policies
        redactor = pipeline.redactor
        let monitors = pipeline.monitors.map { $0.makeMonitor() }
        switch monitors.count {
        case 0: monitor = nil
        case 1: monitor = monitors[0]
        default: monitor = CompositeEventMonitor(monitors)
        }
    }
}

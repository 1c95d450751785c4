import SluiceCore

/// One client request across its upstream tries and redirect hops: the I/O's side of it
/// (the pipeline snapshot, where the tries go, the request body) around its `ExchangeMachine`,
/// which decides everything else and keeps the exchange's record. The stages of
/// `RequestChain` read it and write what they learn into it.
///
/// Holds the worker's pipeline as it was when the request arrived, so a reload never changes
/// a request midway. Owned by its `ClientConnection`, on the worker's thread.
final class Exchange {
    let pipeline: WorkerPipeline
    /// The request as the client sent it.
    let head: HTTPRequestHead
    /// The connection it came on, as the stages see it.
    let client: RequestClient
    /// Who performs the stages' answers: told when a wait ends (an adapter answered, an
    /// upstream slot freed). Cleared when the owner lets the exchange go (a weak reference
    /// would move every retain of the connection onto a side table).
    var owner: (any ExchangeOwner)?
    /// The policy of the host the current try goes to (a followed redirect may change it).
    var tryPolicy: HostPolicy?
    /// The host the policy was matched for.
    let policyHost: String
    /// The `Host` the origin gets when an `upstream:` override changed the port (the client's),
    /// for tries to `target` only (not for a redirect elsewhere).
    var hostHeader: HostHeader?
    /// How the upstream header lines are made when no request model was built (nil: from the
    /// head as it came).
    var forwardedLines: ForwardedLines?
    /// The `X-Request-Id` Sluice made for a request that came without one (every try sends
    /// it); nil when the client's own travels.
    var generatedRequestId: String?
    /// The request body's reader, made at its first use: a request without a body (most
    /// GETs) never makes one (an allocation, its arrays and its release, some 400
    /// instructions a request).
    private(set) lazy var body = RequestBodyReader(encoders: [], replayLimit: replayLimit)
    /// The most body bytes kept for replay (`ExchangeMachine.replayLimit`; 0 without a body).
    private let replayLimit: Int
    /// The `Upgrade` value forwarded for an upgrade the policy allows (`upgrades:`); each try
    /// is then an `UpgradeTransfer`.
    var upgrade: String?
    /// The shared cache's part (set by the lookup; nil without a `cache_store`, or for a
    /// policy that does not cache).
    var cache: CacheExchange?
    /// When the request began waiting for another exchange's fetch of its URL (monotonic ms;
    /// nil: it has not waited).
    var collapsedSince: Int?
    /// The exchange holds one of the worker's upstream slots (`UpstreamSlotStage`) until it ends.
    /// (Declared here, with `stageIndex`, it takes the padding after `collapsedSince`: an
    /// exchange stays within malloc's per-thread cache, 1,032 bytes; the last field that
    /// crossed it cost 400 instructions per request.)
    var holdsUpstreamSlot = false
    private var stageIndex: UInt8 = 0
    /// The request came from another instance of the fleet with a valid `Sluice-Peer`
    /// (`PeerStage`): it is never sent to a third one, and `access.proxy_auth` does not apply.
    var fromPeer = false
    /// The members ranked above this instance for the URL were asked and none answered
    /// (`PeerHop`): the cache's lookup goes on locally, as the owner's would.
    var peersAsked = false
    /// The head whose body is being kept for the scripts (`read_response_body`) carried a pause
    /// the policy's `rate_limit.learn` waits for (`ResponseHeadContext.heldByOrigin`): the
    /// body's run of the stages decides as the head's would have. (In the padding before
    /// `target`, as the flags above.)
    var keptHeldByOrigin = false
    /// Where the current (or last) try goes.
    var target: RequestTarget
    /// The current try's admission by its origin's circuit breaker (`health:`), until its
    /// outcome is reported.
    var circuitTry: CircuitStage.Admitted?
    var machine: ExchangeMachine

    /// The upstream header lines of a request without a model (`forwardedLines`).
    enum ForwardedLines {
        /// The policy's adapters are all fixed header edits: made as the lines are built
        /// from the head.
        case edits(HeaderEditPlan)
        /// The lines the policy's scripts ran on, with their edits made
        /// (`HostPolicy.scriptsOnLines`): every try sends them.
        case scripted(RequestHeaderLines)
    }

    /// The `Host` an `upstream:` override keeps (boxed: it is rare, and an exchange's size is
    /// watched).
    final class HostHeader {
        let value: String
        let target: RequestTarget
        init(value: String, target: RequestTarget) {
            self.value = value
            self.target = target
        }
    }

    init(
        pipeline: WorkerPipeline, head: HTTPRequestHead, client: RequestClient, machine: ExchangeMachine,
        target: RequestTarget, replayLimit: Int
    ) {
        self.pipeline = pipeline
        self.head = head
        self.client = client
        self.machine = machine
        policyHost = target.host
        self.target = target
        self.replayLimit = replayLimit
    }

    /// The index in `RequestChain.request` of the stage the exchange is at (or waits in).
    var stage: Int {
        get { Int(stageIndex) }
        set { stageIndex = UInt8(newValue) }
    }

    /// Reads of the machine go through `inspect`: a non-mutating call on `exchange.machine`
    /// from outside copies the whole machine first (it is a stored struct of a class, which
    /// the callee could otherwise see change), and that is several copies per request.
    func inspect<T>(_ read: (inout ExchangeMachine) -> T) -> T { read(&machine) }

    var id: UInt64 { machine.id }
    var policy: HostPolicy { machine.policy }
    var monitor: (any EventMonitor)? { pipeline.monitor }
    /// The request as the pipeline sees it, when one was built.
    var model: ProxyRequest? { machine.model }
    var ended: Bool { machine.isFinished }

    /// The exchange's record (kept by the machine); tunnels add their counts here.
    var summary: ExchangeSummary {
        get { machine.summary }
        _modify { yield &machine.summary }
    }

    /// Sends `.finished` (once) with the outcome.
    func end(_ outcome: Outcome, error: String? = nil) {
        // The record is lent to the monitors where it lies (`EventMonitor.exchangeEnded`).
        let monitor = monitor
        machine.ended(outcome, error: error) { monitor?.exchangeEnded($0) }
    }

    /// Hands the machine's reports to the monitors.
    func report(_ reports: ExchangeMachine.Reports) {
        guard let monitor else { return }
        reports.forEachEvent { monitor.handle($0) }
    }
}

/// What performs the stages' answers for an exchange (`ClientConnection`).
///
/// Threading: the worker's thread.
protocol ExchangeOwner: UpstreamSlotWaiter {
    /// The `max_concurrent` place the current try holds (`QuotaStage`), released when the try
    /// ends.
    var quotaSlot: QuotaSlot? { get set }
    /// `quotaSlot`, emptied. Every try's end asks (`QuotaStage.end`); through the property's
    /// getter, the answer was copied even when there was none.
    func takeQuotaSlot() -> QuotaSlot?
    /// The adapters answered (at once, or after a wait): `command` is the machine's answer.
    func adaptationAnswered(_ exchange: Exchange, _ command: ExchangeMachine.AdaptedAction?)
}

extension ExchangeMachine.Target {
    init(_ target: RequestTarget) {
        self.init(host: target.host, port: target.port, url: target.url)
    }
}

/// A worker's copy of the pipeline: the shared, immutable policies plus this worker's own
/// monitor instances (whose buffers only this thread touches).
final class WorkerPipeline {
    let policies: PolicyTable
    let redactor: Redactor
    /// nil when no monitor is configured, so the hot path can skip building events.
    let monitor: (any EventMonitor)?
    /// A monitor reads every script call, successful ones without `ctx.vars` included
    /// (`EventMonitor.readsEveryScriptCall`): the scripts' lines path records them only then.
    let recordsEveryScriptCall: Bool
    /// When this worker started using the snapshot, if it replaced another (a reload): TLS
    /// connections opened before then were verified under the previous trust settings and
    /// are not reused for this snapshot's requests.
    let reloadedAt: Int?
    /// This worker's check of `access.proxy_auth` credentials, with its caches: a new one per
    /// snapshot, so a reload (a new users file) starts with empty caches.
    let proxyAuth: ProxyAuthVerifier?

    init(_ pipeline: Pipeline, reload: Bool = false) {
        reloadedAt = reload ? MonotonicClock.milliseconds() : nil
        proxyAuth = pipeline.proxyAuthentication.map { ProxyAuthVerifier($0) }
        policies = pipeline.policies
        redactor = pipeline.redactor
        let monitors = pipeline.monitors.map { $0.makeMonitor() }
        switch monitors.count {
        case 0: monitor = nil
        case 1: monitor = monitors[0]
        default: monitor = CompositeEventMonitor(monitors)
        }
        recordsEveryScriptCall = monitor?.readsEveryScriptCall ?? false
    }
}

import HTTPTypes
import SluiceCore

/// One step of a request's way through Sluice (docs/architecture.md, "A request's way"): it is
/// given the exchange and answers what happens next — the request goes on to the next stage,
/// Sluice answers the client, the request waits for an event, or it leaves the chain for a
/// transport. Stages decide; `ClientConnection` performs what they answer (it owns the
/// socket, the timers and the transfers), as `ExchangeMachine` decides and the I/O performs.
///
/// A stage holds no state: what it learns about a request goes into the
/// `Exchange`, and what it needs of the worker comes through `StageServices`, so that each is
/// tested without sockets (Tests/SluiceServerTests/StageTests.swift). Stages see Swift types
/// only: no stage file calls libevent or libcurl.
///
/// A stage is a type with static members only (the chain lists metatypes: nothing to
/// allocate, retain or copy per request).
///
/// Threading: `enter` runs on the thread of the exchange's worker.
protocol RequestStage: SendableMetatype {
    /// The stage's name in docs/architecture.md: the YAML key or concept it stands for.
    static var name: String { get }
    static func enter(_ exchange: Exchange, _ services: any StageServices) -> StageVerdict
}

/// A step every try passes (`RequestChain.attempt`): like a `RequestStage`, and it completes
/// the try's request in place (a copy of one costs a few hundred bytes). It answers go on,
/// fail this try, answer the client, wait for its turn (`TryHold`), or (the last) send.
protocol TryStage: SendableMetatype {
    static var name: String { get }
    static func enter(_ request: inout UpstreamRequest, _ exchange: Exchange, _ services: any StageServices) -> TryVerdict
}

/// A request stage's answer.
enum StageVerdict {
    /// The next stage takes the request.
    case proceed
    /// Sluice answers the client with `error` (`ProxyError`, docs/errors.md); the exchange ends.
    case respond(ProxyError)
    /// The shared cache answers from a stored response.
    case serveStored(StoredAnswer)
    /// The request waits; the event named resumes the chain at the stage after this one.
    case wait(StageWait)
    /// CONNECT: the chain ends in a byte tunnel to `target` (or, with `intercept`, in Sluice's
    /// TLS server, whose requests start the chain again).
    case tunnel(RequestTarget, intercept: Bool)
}

/// A try stage's answer.
enum TryVerdict {
    /// The next try stage takes the try.
    case proceed
    /// Sluice answers the client with `error`; the exchange ends.
    case respond(ProxyError)
    /// This try fails before it starts (`error`); the exchange's machine decides whether
    /// another try follows (as after a failed connection) or the client is answered.
    case failTry(ProxyError, kind: TransportErrorKind)
    /// The try waits (`TryHold`); the try stages after this one resume when it may go.
    case wait(TryWait)
    /// The try goes out: the last try stage hands its request to a transport.
    case send(UpstreamRoute)
}

/// What a waiting try waits for.
enum TryWait {
    /// A try over its policy's `rate_limit` goes when its turn comes (`QuotaStage`).
    case quota(QuotaWait)
    /// A half-open circuit's trial waits for the fleet's trial lock (`fleet:`): it goes if this
    /// instance takes it, else fails fast (another instance tries the origin).
    case fleetTrial(origin: String, milliseconds: Int)
}

/// What a waiting request waits for.
enum StageWait {
    /// A slot of `limits.max_in_flight_upstream`: `UpstreamGate` hands it over (or refuses)
    /// with this ticket.
    case upstreamSlot(UInt64)
    /// The policy's adapters run on this request (`AdaptersStage.run`): they answer at once or,
    /// when one must fetch something (a token), later; the answer resumes the request
    /// (`ExchangeOwner.adaptationAnswered`).
    case adaptation(ProxyRequest)
    /// Another exchange fetches the same URL (collapsed forwarding): the request waits on that
    /// fetch, reads its response while it is stored (shared fills), or looks up again when it
    /// ends without one or the wait for its head runs out.
    case collapsedFetch(CacheFetch)
    /// A URL another member of a fleet that shares its cache owns (`fleet.cache`): the members
    /// ranked above this one for it are asked, in order (`PeerHop`), before any lookup here;
    /// when none answers, the lookup runs here (`Exchange.peersAsked`).
    case peers(PeerWalk)
    /// The request body: a chunked body's first chunk-size line, validated before anything
    /// goes upstream (`.start`), or a body read whole so that every try can send it (`.whole`).
    case requestBody(RequestBodyWait)
}

/// A try waiting for its turn under its policy's `rate_limit`: for its place in the schedule
/// (or the origin's hold) to come, on a timer — what gives that place back if the request
/// leaves first — or for a `max_concurrent` place, with its ticket. (A class: a verdict stays
/// small to copy and to destroy on the paths that never wait.)
final class QuotaWait {
    enum Kind {
        /// The schedule's (or the hold's) delay, in ms.
        case timer(milliseconds: Int, reservation: RateLimiter.Reservation?)
        /// Waiting for one of `max_concurrent` places as this ticket.
        case slot(ticket: UInt64)
        /// Waiting for the fleet's Redis to decide (at most `fleet.timeout`).
        case fleet
    }

    let kind: Kind
    let limiting: RateLimiting
    let key: String
    /// What held the try back, for the access log (`50/s`, `max_concurrent 4`, the origin's hold).
    let limit: String
    /// When the wait began, and the latest the try may go (monotonic µs).
    let since: Int64
    let deadline: Int64
    /// When the timer ends, the schedule is asked again (a hold waited out before the fleet's
    /// Redis gives the try its place).
    var scheduleAfter = false

    var policy: String { limiting.policy }
    var settings: RateLimitSettings { limiting.settings }

    init(_ kind: Kind, _ limiting: RateLimiting, key: String, limit: String, since: Int64, deadline: Int64) {
        self.kind = kind
        self.limiting = limiting
        self.key = key
        self.limit = limit
        self.since = since
        self.deadline = deadline
    }
}

/// A `max_concurrent` place a try holds until it ends (`ExchangeOwner.quotaSlot`).
struct QuotaSlot {
    let policy: String
    let key: String
    let limit: Int
}

/// A turn given to a try that cannot wait (`QuotaStage.turnWithoutWaiting`), with the
/// `max_concurrent` place it holds until it ends (nil: the policy has none).
struct QuotaTurn {
    let slot: QuotaSlot?
}

enum RequestBodyWait {
    case start
    case whole
}

/// Where a try goes and through which transport (`UpstreamEngine.choose`).
enum UpstreamRoute {
    case native(perTryTimeout: Int)
    case curl(perTryTimeout: Int)
    /// An upgrade handshake (`upgrades:`) forwarding this `Upgrade` value.
    case upgrade(String, perTryTimeout: Int)
}

/// A stored response the cache answers with, and how (docs/caching.md, `Cache-Status`).
struct StoredAnswer {
    let object: CacheObject
    /// The `Cache-Status` parameters, e.g. `hit; ttl=120`.
    let parameters: String
    let age: Int64
    /// The client's conditional matched: `304`.
    let notModified: Bool
}

/// What a stage may use of its worker, as Swift types: implemented by `Worker`, and by the
/// unit tests' own services.
///
/// Threading: called on the worker's thread only.
protocol StageServices: AnyObject {
    /// `timeouts.upstream_per_try`: a try's limit when its policy sets none.
    var upstreamPerTryTimeout: Int { get }
    /// `timeouts.total`: no rate-limit wait goes past it (nil: none).
    var totalTimeout: Int? { get }
    /// The pipeline new requests get (an exchange keeps the one it started with).
    var pipeline: WorkerPipeline { get }
    /// This process's `Via` pseudonym: a request that carries it has looped.
    var viaPseudonym: String { get }
    var health: UpstreamHealth { get }
    /// The process's rate-limit schedules (`rate_limit`), shared by every worker.
    var rateLimits: RateLimitTable { get }
    /// This worker's part of the fleet (`fleet:`; nil: none).
    var fleet: Fleet? { get }
    /// The fleet's shared cache (`fleet.cache`; nil: none): members, owners, peer signatures.
    var peers: FleetPeers? { get }
    /// Hands a `max_concurrent` ticket that was given a place to this worker's loop (any
    /// thread may call it; false: the worker is gone).
    var quotaWake: @Sendable (UInt64) -> Bool { get }
    var cacheStore: CacheStore? { get }
    var diskTier: DiskCacheTier? { get }
    /// What adapters that must fetch something (OAuth 2) are given.
    var adapterSession: any SessionContext { get }
    /// The header lines a transport sends for `fields` (the try stages' adapters changed them).
    func headerLines(for fields: HTTPFields) -> RequestHeaderLines
    /// The header lines a transport sends for `exchange`'s request as it came, with the
    /// policy's header `edits` (`ForwardedHeaders.requestLines`).
    func headerLines(for exchange: Exchange, edits: HeaderEditPlan?) -> RequestHeaderLines
    /// The header lines of `exchange`'s request as `headerLines(for:edits:)` makes them, left
    /// in the worker's line builder without `Via` (`ForwardedHeaders.fieldLines`): a copy of
    /// the builder, which the policy's scripts read in place. The next call here or to
    /// `scriptedLines` uses the builder again.
    func scriptLines(for exchange: Exchange, edits: HeaderEditPlan?) -> RequestHeaderLines.Builder
    /// The lines `scriptLines` left, with the scripts' `edits` made and `Via` last
    /// (`RequestHeaderLines.Builder.finishScripted`).
    func scriptedLines(_ edits: LuaLineEdits) -> RequestHeaderLines
    /// This worker saw the https origin choose HTTP/1.1 by ALPN lately (`TLSProtocolMemory`).
    func originChoseHTTP1(_ target: RequestTarget) -> Bool
    /// Asks for a slot of `limits.max_in_flight_upstream` (`UpstreamGate`).
    func admitUpstream(_ waiter: any UpstreamSlotWaiter) -> UpstreamGate.Answer
    /// Starts a background revalidation of a stored response (stale-while-revalidate) under
    /// the fetch claim `token`, as the try `admitted` (finished when it ends).
    func revalidateInBackground(
        _ object: CacheObject, _ cache: CacheExchange, token: UInt64, validators: [CacheLookup.Validator], hostHeader: String?,
        as admitted: BackgroundTry)
    /// A new request's id, and the `X-Request-Id` value made from it.
    func nextRequestID() -> UInt64
    func makeRequestId(_ id: UInt64) -> String
}

/// What a request waiting for an upstream slot is told (implemented by `ClientConnection`).
///
/// Threading: the worker's thread, in a loop pass of the gate's own.
protocol UpstreamSlotWaiter: AnyObject {
    /// A slot freed for the request waiting with `ticket`; false when it no longer waits (the
    /// slot is then not taken).
    func upstreamSlotGranted(_ ticket: UInt64) -> Bool
    /// The request waiting with `ticket` is refused (the queue's wait ran out).
    func upstreamSlotRefused(_ ticket: UInt64, _ error: ProxyError)
}

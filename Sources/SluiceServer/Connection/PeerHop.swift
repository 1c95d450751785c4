import SluiceCore

/// A request for a URL that members of the fleet rank above this instance asking them for it
/// (`fleet.cache`; docs/fleet.md, "One cache across the fleet"), one at a time, owner first:
/// the first that answers serves the client, and this instance's own store is not looked up
/// (a copy it kept from a time it owned the URL is not the owner's). Each is asked over Sluice's own HTTP/1.1 client,
/// on the worker's pool of connections to its address, with the client's request as it came
/// (absolute form, the origin's `Host`, minus hop-by-hop fields) and `Sluice-Peer` signed for
/// this instance (`PeerSignature`).
///
/// The peer runs its own policy for the URL — the same configuration as this one — so this
/// instance does none of its part of it for the hop: no adapters, signers, rate limit or
/// origin circuit, and no retry of the peer's answer. The answer is not stored here (the owner
/// keeps the one copy); its `Cache-Status` gets this instance's entry after the peer's, naming
/// the peer (`fwd=uri-miss; detail="peer 10.0.0.5:3128"`). A peer that refuses the connection,
/// cannot be reached within `timeouts.upstream_connect` or fails before its response head is
/// marked down for a few seconds (`PeerDownMarks`) and the next is asked; after the last, the
/// lookup runs here (`Exchange.peersAsked`): a copy of its own answers, and a miss is fetched
/// as by the owner. A
/// failure after the head went to the client ends the response incomplete, as any upstream's.
///
/// It is the transfer's delegate for the hop and passes the client's side of each event on to
/// its `ExchangeDriver`. Threading: made, used and dropped on the exchange's worker thread; the
/// driver holds it (`peerHop`) while it runs.
final class PeerHop: UpstreamTransferDelegate {
    unowned(unsafe) let driver: ExchangeDriver
    let exchange: Exchange
    let peers: FleetPeers
    private var walk: PeerWalk
    /// The member being asked (its `advertise` address), and since when (monotonic µs).
    private(set) var peer = ""
    private var startedAt: Int64 = 0

    init(driver: ExchangeDriver, exchange: Exchange, peers: FleetPeers, walk: PeerWalk) {
        self.driver = driver
        self.exchange = exchange
        self.peers = peers
        self.walk = walk
    }

    /// This instance's `Cache-Status` entry while the members above it are asked: to it, a URL
    /// another member owns is a miss (its own store is looked up only when the walk reaches it).
    static let parameters = "fwd=uri-miss"

    /// The next member to ask, skipping (and counting) those marked down; nil when the walk
    /// reached this instance.
    func nextPeer() -> UpstreamOrigin? {
        let now = MonotonicClock.milliseconds()
        let (marks, metrics) = (peers.downMarks, peers.requestMetrics)
        while let next = walk.next(
            isDown: { marks.isDown($0, now: now) }, skipped: { metrics.record(.skippedDown, peer: $0) })
        {
            // The members' addresses were checked when the configuration was read.
            guard let origin = Self.origin(next) else { continue }
            peer = next
            startedAt = MonotonicClock.microseconds()
            return origin
        }
        return nil
    }

    /// The request for the peer: the client's, as the head's bytes give it (no adapter ran),
    /// with `Sluice-Peer` signed by this instance.
    func request(_ tries: TryBuilder) throws(ProxyError) -> UpstreamRequest {
        var request = try tries.request(exchange, canResendBody: false)
        let field = peers.signature.fieldValue(
            method: request.method, url: request.target.url, sender: peers.settings.advertise,
            now: CacheStage.wallClockSeconds(), nonce: UInt64.random(in: 0...UInt64.max))
        request.headers = request.headers.appending(name: PeerSignature.fieldName, value: field)
        // A `lua` sub-request's depth goes to the peer, which runs its scripts, bare: the peer
        // reads it from a signed request only (`ForwardedHeaders.scriptDepth`).
        let depth = ForwardedHeaders.scriptDepth(of: exchange.head, fromPeer: false)
        if depth > 0 { request.headers = request.headers.appending(name: LuaSubrequest.depthHeader, value: String(depth)) }
        return request
    }

    /// How long the peer may take to answer: what the exchange's own tries could take, all
    /// of them (its retry deadline, else each try's limit once per try the policy allows), so
    /// that the owner's retries fit.
    func timeout(_ services: any StageServices) -> Int {
        let retry = exchange.policy.retryPolicy
        if let deadline = retry?.deadline { return deadline }
        return (retry?.perTryTimeout ?? services.upstreamPerTryTimeout) * (1 + (retry?.limit ?? 0))
    }

    /// `10.0.0.5:3128` or `[fd00::5]:3128` as the pool's key.
    static func origin(_ address: String) -> UpstreamOrigin? {
        guard let colon = address.lastIndex(of: ":"), let port = Int(address[address.index(after: colon)...]) else {
            return nil
        }
        var host = address[..<colon]
        if host.hasPrefix("["), host.hasSuffix("]") { host = host.dropFirst().dropLast() }
        return UpstreamOrigin(host: String(host), port: port)
    }

    private var elapsed: Int64 { MonotonicClock.microseconds() - startedAt }

    // MARK: UpstreamTransferDelegate

    /// The peer answered: its head goes to the client as it came, with this instance's
    /// `Cache-Status` entry after the peer's own.
    func responseHeadArrived(_ head: consuming UpstreamResponseHead, on transfer: any UpstreamTransfer) {
        peers.downMarks.markUp(peer)
        peers.requestMetrics.record(.answered, peer: peer)
        let parameters = Self.parameters + "; detail=\"peer \(peer)\""
        exchange.summary.cache = parameters
        transfer.extraHeadLines = Array("Cache-Status: Sluice; \(parameters)\r\n".utf8)
        transfer.forward(keepAlive: driver.connection.keepsAliveAfterResponse)
    }

    /// The peer gave no answer: marked down, and the next member is asked (or the lookup goes
    /// on here).
    func transferFailed(_ error: ProxyError, kind: TransportErrorKind) {
        withExtendedLifetime(self) {
            Log.debug("fleet.cache: peer \(peer) did not answer: \(error.message)")
            peers.downMarks.markDown(peer, now: MonotonicClock.milliseconds())
            peers.requestMetrics.record(.failed, peer: peer)
            driver.peerFailed(self)
        }
    }

    func tryEnded(timings: TryTimings) {
        peers.requestMetrics.recordDuration(peer: peer, microseconds: elapsed)
        exchange.report(exchange.machine.tryEnded(timings))
    }

    func interimResponse(status: Int, fields: [(name: String, value: String)]) {
        driver.interimResponse(status: status, fields: fields)
    }

    func responseStarted(status: Int) { driver.responseStarted(status: status) }
    func responseBodySent(bytes: Int) { driver.responseBodySent(bytes: bytes) }

    func transferFinished(reusable: Bool) {
        withExtendedLifetime(self) { driver.transferFinished(reusable: reusable) }
    }

    func transferAborted() {
        withExtendedLifetime(self) { driver.transferAborted() }
    }

    // The hop forwards every head (it never redirects, discards, absorbs or collects), has no
    // tee (nothing to detach) and is never resumed (nothing continues).
    func transferRedirected(to next: UpstreamRequest) {}
    func transferDiscarded() {}
    func transferAbsorbed() {}
    func transferCollected(_ head: UpstreamResponseHead, body: [UInt8]) {}
    func collectionOverflowed(_ head: UpstreamResponseHead, on transfer: any UpstreamTransfer) {
        transfer.forward(keepAlive: false)
    }
    func clientFellBehind(_ transfer: any UpstreamTransfer) -> Bool { false }
    func continuationArrived(_ head: UpstreamResponseHead) -> Bool { false }
}

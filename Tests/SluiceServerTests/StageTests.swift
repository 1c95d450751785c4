import HTTPTypes
import Testing

@testable import SluiceCore
@testable import SluiceServer

/// The request stages (`RequestChain`) without sockets: each is given an exchange built from
/// a parsed head and a worker's services of the test's own, and its answer is checked.
@Suite struct StageTests {
    /// A worker as the stages see it: the policies and the cache the test gives, an upstream
    /// gate that answers what the test says, and a record of background revalidations.
    final class Services: StageServices {
        var pipeline: WorkerPipeline
        let viaPseudonym = "sluice-test"
        let health = UpstreamHealth()
        let rateLimits = RateLimitTable()
        var cacheStore: CacheStore?
        var diskTier: DiskCacheTier? { nil }
        let adapterSession: any SessionContext = NoSession()
        let upstreamPerTryTimeout = 30_000
        let totalTimeout: Int? = nil
        let fleet: Fleet? = nil
        var peers: FleetPeers?
        let quotaWake: @Sendable (UInt64) -> Bool = { _ in true }
        var gate: UpstreamGate.Answer = .go
        var revalidations = 0
        private var ids: UInt64 = 0

        init(
            _ entries: [PolicyEntry] = [PolicyEntry(name: "default")], cache: CacheStore? = nil,
            proxyAuth: ProxyAuthentication? = nil
        ) {
            var pipeline = Pipeline(policies: PolicyTable(entries: entries), monitors: [])
            pipeline.proxyAuthentication = proxyAuth
            self.pipeline = WorkerPipeline(pipeline)
            cacheStore = cache
        }

        var http1Origins: Set<String> = []
        func originChoseHTTP1(_ target: RequestTarget) -> Bool { http1Origins.contains(target.authority) }
        func admitUpstream(_ waiter: any UpstreamSlotWaiter) -> UpstreamGate.Answer { gate }
        func revalidateInBackground(
            _ object: CacheObject, _ cache: CacheExchange, token: UInt64, validators: [CacheLookup.Validator],
            hostHeader: String?, as admitted: BackgroundTry
        ) {
            revalidations += 1
            admitted.finish(.success)
        }
        func nextRequestID() -> UInt64 {
            ids += 1
            return ids
        }
        func makeRequestId(_ id: UInt64) -> String { "test-\(id)" }
        func headerLines(for fields: HTTPFields) -> RequestHeaderLines {
            var builder = RequestHeaderLines.Builder()
            return ForwardedHeaders.requestLines(for: fields, viaLine: Array("Via: 1.1 sluice-test".utf8), builder: &builder)
        }
        func headerLines(for exchange: Exchange, edits: HeaderEditPlan?) -> RequestHeaderLines {
            var builder = RequestHeaderLines.Builder()
            return ForwardedHeaders.requestLines(
                for: exchange.head, viaLine: Array("Via: 1.1 sluice-test".utf8), edits: edits,
                requestId: exchange.generatedRequestId, forwarding: exchange.client.forwarding, builder: &builder)
        }
        var scriptBuilder = RequestHeaderLines.Builder()
        func scriptLines(for exchange: Exchange, edits: HeaderEditPlan?) -> RequestHeaderLines.Builder {
            ForwardedHeaders.fieldLines(of: exchange, edits: edits, builder: &scriptBuilder)
            return scriptBuilder
        }
        func scriptedLines(_ edits: LuaLineEdits) -> RequestHeaderLines {
            scriptBuilder.finishScripted(edits, viaLine: Array("Via: 1.1 sluice-test".utf8))
        }
    }

    /// Adapters here fetch nothing: a session that is never used.
    final class NoSession: SessionContext {
        struct Waker: SessionWaker {
            func wake() {}
            var id: Int { 0 }
        }
        func post(
            url: String, headers: [(String, String)], body: [UInt8],
            completion: @escaping (Result<(status: Int, body: [UInt8]), ProxyError>) -> Void
        ) { completion(.failure(.malformedRequest("no session in unit tests"))) }
        func park(_ work: @escaping () -> Bool) {}
        var waker: any SessionWaker { Waker() }
        var monitor: (any EventMonitor)? { nil }
    }

    /// What a connection is told: adapters' late answers and upstream slots.
    final class Owner: ExchangeOwner {
        var answers: [ExchangeMachine.AdaptedAction?] = []
        var quotaSlot: QuotaSlot?
        func takeQuotaSlot() -> QuotaSlot? { quotaSlot.take() }
        func adaptationAnswered(_ exchange: Exchange, _ command: ExchangeMachine.AdaptedAction?) { answers.append(command) }
        func upstreamSlotGranted(_ ticket: UInt64) -> Bool { true }
        func upstreamSlotRefused(_ ticket: UInt64, _ error: ProxyError) {}
    }

    static func head(_ text: String) -> HTTPRequestHead {
        var parser = HTTPRequestParser(limits: .init(ServerConfiguration.Limits()))
        let bytes = UnsafeMutableRawBufferPointer.allocate(byteCount: text.utf8.count, alignment: 1)
        defer { bytes.deallocate() }
        bytes.copyBytes(from: text.utf8)
        var offset = 0
        while offset < bytes.count {
            guard let (consumed, event) = try? parser.parse(UnsafeRawBufferPointer(rebasing: bytes[offset...])) else { break }
            if case .head(let head)? = event { return head }
            if consumed == 0 { break }
            offset += consumed
        }
        fatalError("not a request head: \(text)")
    }

    let owner = Owner()

    /// The exchange `Admission` makes for `request` on a forward-proxy connection (or `client`).
    func exchange(
        _ request: String, _ services: Services,
        client: RequestClient = RequestClient(peer: "127.0.0.1:1", address: "127.0.0.1", mode: .forward, forwarding: nil)
    ) throws(ProxyError) -> Exchange {
        let head = Self.head(request)
        let target = try Admission.target(
            of: head, client: client, connectPorts: [443], viaPseudonym: services.viaPseudonym)
        let exchange = try Admission.begin(head, method: head.method, target, client: client, services: services)
        exchange.owner = owner
        return exchange
    }

    @Test func theChainIsInTheDocumentedOrder() {
        #expect(
            RequestChain.request.map { $0.name } == [
                "peer", "proxy_auth", "tunnel", "cache", "upstream_slot", "adapters", "request_body",
            ])
        #expect(RequestChain.attempt.map { $0.name } == ["trust", "health", "rate_limit", "try_adapters", "upstream"])
    }

    @Test func aPlainGetPassesEveryRequestStage() throws {
        let services = Services()
        let exchange = try exchange("GET http://127.0.0.1:8080/a HTTP/1.1\r\nHost: x\r\n\r\n", services)
        guard case .proceed = RequestChain.run(exchange, from: 0, services) else {
            Issue.record("a plain GET stopped in a stage")
            return
        }
        #expect(exchange.stage == RequestChain.request.count)
        #expect(exchange.holdsUpstreamSlot)
        #expect(exchange.summary.requestId == "test-1")
    }

    /// An exchange (its machine and record inside) comes from malloc's per-thread cache, which
    /// serves 1,032 bytes at most: past that, each request's exchange costs the slow path of
    /// `malloc` and `free` (measured: 450 instructions a request).
    @Test func anExchangeFitsMallocsThreadCache() throws {
        let exchange = try exchange("GET http://127.0.0.1:8080/a HTTP/1.1\r\nHost: x\r\n\r\n", Services())
        #expect(mallocUsableSize(Unmanaged.passUnretained(exchange).toOpaque()) <= 1032)
    }

    @Test func admissionRefusesLoopsPortsAndForms() {
        let services = Services()
        #expect(throws: ProxyError.loopDetected) {
            try exchange("GET http://a/ HTTP/1.1\r\nHost: a\r\nVia: 1.1 sluice-test\r\n\r\n", services)
        }
        #expect(throws: ProxyError.connectPortNotAllowed(25)) {
            try exchange("CONNECT a:25 HTTP/1.1\r\nHost: a:25\r\n\r\n", services)
        }
        #expect(throws: ProxyError.self) { try exchange("GET /a HTTP/1.1\r\nHost: a\r\n\r\n", services) }
        let route = ServerConfiguration.Route(listen: "127.0.0.1:9", upstream: "http://origin:81/base")
        let routed = try? exchange(
            "GET /a?b HTTP/1.1\r\nHost: a\r\n\r\n", services,
            client: RequestClient(peer: "p:1", address: "p", mode: .route(route), forwarding: nil))
        #expect(routed?.target.url == "http://origin:81/base/a?b")
    }

    @Test func proxyAuthAsksOnceAndRemembersTheConnection() throws {
        guard case .success(let users) = ProxyAuthentication.parse("bob:\(Self.sha256Hash)\n", usersFile: "/u") else {
            Issue.record("users file")
            return
        }
        let services = Services(proxyAuth: users)
        let missing = try exchange("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", services)
        guard case .respond(.proxyAuthenticationRequired(reason: .missing)) = ProxyAuthStage.enter(missing, services) else {
            Issue.record("no credentials must be answered 407")
            return
        }
        let client = RequestClient(peer: "p:1", address: "p", mode: .forward, forwarding: nil)
        let request = "GET http://a/ HTTP/1.1\r\nHost: a\r\nProxy-Authorization: Basic Ym9iOmJhdHRlcnkgc3RhcGxl\r\n\r\n"
        for _ in 0..<2 {
            let exchange = try exchange(request, services, client: client)
            guard case .proceed = ProxyAuthStage.enter(exchange, services) else {
                Issue.record("bob's credentials must pass")
                return
            }
            #expect(exchange.summary.user == "bob")
        }
        #expect(client.acceptedCredential?.user == "bob")
        #expect(services.pipeline.proxyAuth?.hashesComputed == 1, "the second request is not hashed again")
        let wrong = try exchange(
            "GET http://a/ HTTP/1.1\r\nHost: a\r\nProxy-Authorization: Basic Ym9iOndyb25n\r\n\r\n", services, client: client)
        guard case .respond(.proxyAuthenticationRequired(reason: .invalid)) = ProxyAuthStage.enter(wrong, services) else {
            Issue.record("a wrong password must be answered 407")
            return
        }
    }

    @Test func connectLeavesTheChainAndUpgradesAreMarked() throws {
        let services = Services()
        let connect = try exchange("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", services)
        guard case .tunnel(let target, intercept: false) = TunnelStage.enter(connect, services) else {
            Issue.record("CONNECT must become a tunnel")
            return
        }
        #expect(target.authority == "example.com:443")
        let socket = try exchange(
            "GET http://a/ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", services)
        guard case .proceed = TunnelStage.enter(socket, services) else {
            Issue.record("an upgrade goes on through the chain")
            return
        }
        #expect(socket.upgrade == "websocket")
    }

    @Test func aMissOnANonOwnerAsksTheMembersAboveItAndAPeersRequestIsServedHere() throws {
        let store = CacheStore(.init(memory: 1 << 20, maxObjectSize: 1 << 20))
        let services = Services(cache: store)
        var settings = FleetCacheSettings(advertise: "10.0.0.1:3128", secret: Secret("fleet-secret-0123456789"))
        settings.peers = [.init(address: "10.0.0.2:3128"), .init(address: "10.0.0.3:3128")]
        let peers = FleetPeers(settings, redis: false)
        services.peers = peers
        // A URL another member owns: the walk is those ranked above this instance, owner first.
        let url = try #require((0..<20).map { "http://a/\($0)" }.first { peers.owners.owner(of: $0)?.address != "10.0.0.1:3128" })
        let above = peers.owners.ranked(url).map(\.address).prefix { $0 != "10.0.0.1:3128" }
        let get = "GET \(url) HTTP/1.1\r\nHost: a\r\n\r\n"
        let client = try exchange(get, services)
        guard case .wait(.peers(let walk)) = CacheStage.enter(client, services) else {
            Issue.record("a client's miss on a non-owner asks the members above it")
            return
        }
        #expect(walk.peers == Array(above))
        #expect(client.cache?.fetch == nil, "it claims no fetch: the owner collapses the misses")
        // A peer's request is served here, as by the owner: it claims the fetch.
        let fromPeer = try exchange(get, services)
        fromPeer.fromPeer = true
        guard case .proceed = CacheStage.enter(fromPeer, services) else {
            Issue.record("a peer's miss goes to the origin from here")
            return
        }
        #expect(fromPeer.cache?.fetch != nil)
        fromPeer.cache?.endFetch()
        // Once the members above it did not answer, the client's lookup goes on here too.
        client.peersAsked = true
        guard case .proceed = CacheStage.enter(client, services) else {
            Issue.record("after the peers, a miss goes to the origin from here")
            return
        }
        #expect(client.cache?.fetch != nil)
        // A URL this instance owns asks nobody.
        let own = try #require((0..<20).map { "http://a/\($0)" }.first { peers.owners.owner(of: $0)?.address == "10.0.0.1:3128" })
        guard case .proceed = CacheStage.enter(try exchange("GET \(own) HTTP/1.1\r\nHost: a\r\n\r\n", services), services) else {
            Issue.record("the owner's miss goes to the origin")
            return
        }
    }

    @Test func aCopyKeptOnANonOwnerIsNotServedUntilTheMembersAboveItFail() throws {
        let store = CacheStore(.init(memory: 1 << 20, maxObjectSize: 1 << 20))
        let services = Services(cache: store)
        var settings = FleetCacheSettings(advertise: "10.0.0.1:3128", secret: Secret("fleet-secret-0123456789"))
        settings.peers = [.init(address: "10.0.0.2:3128")]
        let peers = FleetPeers(settings, redis: false)
        services.peers = peers
        let url = try #require((0..<20).map { "http://a/\($0)" }.first { peers.owners.owner(of: $0)?.address != "10.0.0.1:3128" })
        // A fresh copy stored while this instance owned the URL (its owner was away).
        let now = CacheStage.wallClockSeconds()
        let fill = CacheFill(
            store: store, url: url,
            response: CacheStoredResponse(
                status: 200, fields: [("Cache-Control", "max-age=60"), ("Content-Length", "2")],
                requestTime: now, responseTime: now),
            contentLength: 2, fetch: nil)
        [UInt8]("ok".utf8).withUnsafeBytes { fill.append($0) }
        #expect(fill.complete() == 0)
        let client = try exchange("GET \(url) HTTP/1.1\r\nHost: a\r\n\r\n", services)
        guard case .wait(.peers(let walk)) = CacheStage.enter(client, services) else {
            Issue.record("the owner is asked, not the copy kept here")
            return
        }
        #expect(walk.peers == ["10.0.0.2:3128"])
        #expect(client.cache == nil && client.summary.cache == "fwd=uri-miss", "nothing was looked up here")
        // The owner did not answer: the copy kept here answers, nothing is fetched.
        client.peersAsked = true
        guard case .serveStored(let answer) = CacheStage.enter(client, services) else {
            Issue.record("after the members above it, the copy kept here answers")
            return
        }
        #expect(answer.parameters.hasPrefix("hit; ttl="))
    }

    @Test func cacheAnswersHitsCollapsesMissesAndRefusesOnlyIfCached() throws {
        let store = CacheStore(.init(memory: 1 << 20, maxObjectSize: 1 << 20))
        let services = Services(cache: store)
        let get = "GET http://a/x HTTP/1.1\r\nHost: a\r\n\r\n"
        let first = try exchange(get, services)
        guard case .proceed = CacheStage.enter(first, services) else {
            Issue.record("the first miss goes to the origin")
            return
        }
        #expect(first.cache?.fetch != nil, "it holds the URL's fetch claim")
        let second = try exchange(get, services)
        guard case .wait(.collapsedFetch(let awaited)) = CacheStage.enter(second, services) else {
            Issue.record("a second miss waits for the first's fetch")
            return
        }
        #expect(awaited === first.cache?.fetch, "it waits on the first's fetch")
        guard case .proceed = CacheStage.enter(second, services) else {
            Issue.record("after its wait, a miss goes to the origin itself")
            return
        }
        let now = CacheStage.wallClockSeconds()
        let fill = CacheFill(
            store: store, url: "http://a/x",
            response: CacheStoredResponse(
                status: 200, fields: [("Cache-Control", "max-age=60"), ("Content-Length", "2")],
                requestTime: now, responseTime: now),
            contentLength: 2, fetch: first.cache?.fetch)
        // The fill publishes its body to the waiters of the fetch as it is stored.
        #expect(awaited.snapshot.phase == .streaming && awaited.snapshot.stream is FillStream)
        [UInt8]("ok".utf8).withUnsafeBytes { fill.append($0) }
        #expect(fill.complete() == 0)
        #expect(awaited.snapshot.phase == .ended(complete: true) && awaited.snapshot.available == 2)
        first.cache?.endFetch()
        let third = try exchange(get, services)
        guard case .serveStored(let answer) = CacheStage.enter(third, services) else {
            Issue.record("a fresh stored response answers")
            return
        }
        #expect(answer.parameters.hasPrefix("hit; ttl="))
        #expect(!answer.notModified)
        let onlyIfCached = try exchange(
            "GET http://a/other HTTP/1.1\r\nHost: a\r\nCache-Control: only-if-cached\r\n\r\n", services)
        guard case .respond(.onlyIfCachedMiss) = CacheStage.enter(onlyIfCached, services) else {
            Issue.record("only-if-cached without a stored response is 504")
            return
        }
    }

    /// An adapter that answers when the test says so, as one fetching an OAuth token would.
    final class LateAdapter: RequestAdapter, @unchecked Sendable {
        let name = "late"
        var request: ProxyRequest?
        var answer: ((Result<ProxyRequest, AdaptationError>) -> Void)?
        func adapt(_ request: ProxyRequest, completion: @escaping (Result<ProxyRequest, AdaptationError>) -> Void) {
            self.request = request
            answer = completion
        }
    }

    /// A script on the lines that keeps a `ctx` has it closed at the exchange's end, which
    /// looks for one only then (or for `on_log`, `on_response`, a recorded call).
    @Test func aContextKeptByAScriptOnTheLinesIsClosedAtTheEnd() throws {
        let source = #"return { on_request = function(req, ctx) ctx.seen = req.headers:get("X-Client") end }"#
        let script = LuaAdapter(script: LuaScript(name: "ctx.lua", source: source), origin: "source")
        let services = Services([PolicyEntry(name: "default", adapters: [script])])
        let exchange = try exchange("GET http://a/p HTTP/1.1\r\nHost: a\r\nX-Client: c1\r\n\r\n", services)
        guard case .proceed = AdaptersStage.enter(exchange, services) else {
            Issue.record("the script runs in place")
            return
        }
        #expect(exchange.machine.keepsScriptContexts)
        #expect(LuaStateCache.current.open[exchange.id] != nil)
        let kept = try #require(LuaStateCache.current.open[exchange.id]?.first)
        _ = exchange.machine.ended(.ok, error: nil)
        #expect(LuaStateCache.current.open[exchange.id] == nil)

        // A call that answers after the exchange ended (its client left while it waited) keeps
        // nothing open: nothing would close it.
        LuaStateCache.current.lastExchange = kept
        exchange.takeLuaCall()
        #expect(LuaStateCache.current.open[exchange.id] == nil && LuaStateCache.current.lastExchange == nil)
    }

    @Test func scriptsRunOnTheLinesWithoutAModel() throws {
        let source =
            #"return { on_request = function(req) req.headers:set("X-Seen", req.headers:get("X-Client") or "none") end }"#
        let script = LuaAdapter(script: LuaScript(name: "seen.lua", source: source), origin: "source")
        let services = Services([PolicyEntry(name: "default", adapters: [BearerAdapter(token: Secret("t")), script])])
        let exchange = try exchange("GET http://a/p HTTP/1.1\r\nHost: a\r\nX-Client: c1\r\n\r\n", services)
        // A record left on this thread's cache by a caller no stage took it from (an adapter
        // test run before this one on the same thread) is not this exchange's.
        LuaStateCache.current.lastCall = LuaCallRecord(
            script: "other.lua", hook: "on_request", result: LuaCallResult(), vars: [:])
        guard case .proceed = AdaptersStage.enter(exchange, services) else {
            Issue.record("the script runs in place")
            return
        }
        guard case .scripted(let lines)? = exchange.forwardedLines else {
            Issue.record("the lines are the scripts'")
            return
        }
        #expect(exchange.model == nil)
        #expect(lines.lines.contains("X-Seen: c1") && lines.lines.contains("Authorization: Bearer t"), "\(lines.lines)")
        #expect(lines.lines.last == "Via: 1.1 sluice-test")
        // No monitor reads a call that succeeded and left no ctx.vars: none is recorded; with
        // the metrics, it is.
        #expect(exchange.summary.lua == nil)
        services.pipeline = WorkerPipeline(
            Pipeline(policies: services.pipeline.policies, monitors: [MetricsMonitorFactory()]))
        let counted = try self.exchange("GET http://a/p HTTP/1.1\r\nHost: a\r\nX-Client: c1\r\n\r\n", services)
        guard case .proceed = AdaptersStage.enter(counted, services) else {
            Issue.record("the script runs in place")
            return
        }
        #expect(counted.summary.lua?.outcome == "ok")

        let path = #"return { on_request = function(req) req.path = "/q"; req.headers:set("X-A", "1") end }"#
        let pathServices = Services([
            PolicyEntry(
                name: "default", adapters: [LuaAdapter(script: LuaScript(name: "path.lua", source: path), origin: "source")])
        ])
        let moved = try self.exchange("GET http://a/p HTTP/1.1\r\nHost: a\r\n\r\n", pathServices)
        guard case .proceed = AdaptersStage.enter(moved, pathServices) else {
            Issue.record("a path change goes on")
            return
        }
        #expect(moved.model?.url == "http://a/q" && moved.model?.headerFields[HTTPField.Name("X-A")!] == "1")
    }

    @Test func headerEditsNeedNoModelAndALateAdapterIsWaitedFor() throws {
        let edits = Services([PolicyEntry(name: "default", adapters: [BearerAdapter(token: Secret("t"))])])
        let plain = try exchange("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", edits)
        guard case .proceed = AdaptersStage.enter(plain, edits) else {
            Issue.record("header edits go on at once")
            return
        }
        let applied = if case .edits? = plain.forwardedLines { true } else { false }
        #expect(applied && plain.model == nil, "applied as the header list is built")

        for succeeds in [true, false] {
            let late = LateAdapter()
            let services = Services([PolicyEntry(name: "default", adapters: [late])])
            let exchange = try exchange("GET http://a/x HTTP/1.1\r\nHost: a\r\n\r\n", services)
            guard case .wait(.adaptation(let request)) = AdaptersStage.enter(exchange, services) else {
                Issue.record("an adapter that is not a header edit gets the request model")
                return
            }
            #expect(request.url == "http://a/x")
            AdaptersStage.run(request, exchange, services)
            #expect(owner.answers.isEmpty, "nothing is answered before the adapter is")
            #expect(exchange.inspect { $0.state.name } == "awaiting_credential")
            late.answer?(succeeds ? .success(request) : .failure(AdaptationError(adapter: "late", reason: "no token")))
            #expect(owner.answers.count == 1)
            switch owner.answers.last ?? nil {
            case .forward?: #expect(succeeds)
            case .fail(.adapterFailed(name: "late", reason: "no token"))?: #expect(!succeeds)
            default: Issue.record("the adapter's answer must go on or fail the request")
            }
            owner.answers.removeAll()
        }
    }

    @Test func theUpstreamSlotGoesWaitsOrRefuses() throws {
        let services = Services()
        let exchange = try exchange("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", services)
        guard case .proceed = UpstreamSlotStage.enter(exchange, services), exchange.holdsUpstreamSlot else {
            Issue.record("a free slot is taken")
            return
        }
        services.gate = .wait(7)
        guard
            case .wait(.upstreamSlot(7)) = UpstreamSlotStage.enter(
                try self.exchange("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", services), services)
        else {
            Issue.record("a full gate queues the request")
            return
        }
        services.gate = .refuse(.upstreamQueueFull(limit: 1))
        guard
            case .respond(.upstreamQueueFull) = UpstreamSlotStage.enter(
                try self.exchange("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", services), services)
        else {
            Issue.record("a full queue refuses")
            return
        }
    }

    @Test func aChunkedBodyWaitsForItsFirstChunk() throws {
        let services = Services()
        let chunked = try exchange(
            "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", services)
        guard case .wait(.requestBody(.start)) = RequestBodyStage.enter(chunked, services) else {
            Issue.record("a chunked body is validated before the try")
            return
        }
        let plain = try exchange("POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\n", services)
        guard case .proceed = RequestBodyStage.enter(plain, services) else {
            Issue.record("a body nobody will resend streams")
            return
        }
    }

    /// The try stages of `exchange`'s first try (no adapters: straight from its target).
    func runTry(_ exchange: Exchange, _ services: Services) -> TryVerdict {
        _ = exchange.machine.prepare(model: nil)
        var request = UpstreamRequest(
            method: exchange.head.method, target: exchange.target, headers: RequestHeaderLines.Builder().makeLines(), body: .none,
            model: nil)
        return RequestChain.runTry(&request, exchange, services)
    }

    @Test func eachTryGoesThroughItsTransport() throws {
        let services = Services()
        guard case .send(.native) = runTry(try exchange("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", services), services) else {
            Issue.record("plain http goes through the native transport")
            return
        }
        guard case .send(.curl) = runTry(try exchange("GET https://a/ HTTP/1.1\r\nHost: a\r\n\r\n", services), services) else {
            Issue.record("https goes through libcurl")
            return
        }
        let socket = try exchange(
            "GET http://a/ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", services)
        _ = TunnelStage.enter(socket, services)
        guard case .send(.upgrade("websocket", _)) = runTry(socket, services) else {
            Issue.record("an upgrade is a handshake")
            return
        }
    }

    @Test func anOpenCircuitFailsTheTryFast() throws {
        let services = Services([PolicyEntry(name: "default", health: .on(Health(consecutiveFailures: 2, cooldown: 60_000)))])
        for _ in 0..<2 {
            let exchange = try exchange("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", services)
            guard case .send = runTry(exchange, services) else {
                Issue.record("a closed circuit lets the try go")
                return
            }
            CircuitStage.reportOutcome(.failure, exchange, services.health)
        }
        let exchange = try exchange("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", services)
        guard case .failTry(.upstreamCircuitOpen, kind: .other) = runTry(exchange, services) else {
            Issue.record("two failures in a row open the circuit")
            return
        }
        #expect(exchange.summary.circuit == "open")
    }

    @Test func aBackgroundTryGoesOnlyOnATurnNowAndAClosedCircuit() throws {
        let limit = RateLimitSettings(limits: [RateLimit(requests: 10, periodMilliseconds: 1000)], maxWait: 150)
        let services = Services([
            PolicyEntry(
                name: "default", health: .on(Health(consecutiveFailures: 1, cooldown: 60_000)), rateLimit: .on(limit))
        ])
        func request(_ host: String) throws -> Exchange {
            try exchange("GET http://\(host)/ HTTP/1.1\r\nHost: \(host)\r\n\r\n", services)
        }
        let admitted = try #require(BackgroundTry.admit(try request("a"), services), "a turn free now")
        // The next turn of host a is 100 ms away: a background try does not wait for it.
        #expect(BackgroundTry.admit(try request("a"), services) == nil)
        // Its outcome reaches the breaker: one failure opens a's circuit, and the exchange's
        // next try fails fast.
        admitted.finish(.failure)
        guard case .failTry(.upstreamCircuitOpen, kind: .other) = runTry(try request("a"), services) else {
            Issue.record("the background try's failure opened the circuit")
            return
        }
        // No background try to an origin whose circuit is not closed; another origin's goes.
        #expect(BackgroundTry.admit(try request("a"), services) == nil)
        let other = try #require(BackgroundTry.admit(try request("b"), services))
        other.finish(.success)
    }

    @Test func theQuotaWaitsRefusesAndCountsByItsKey() throws {
        let limit = RateLimitSettings(limits: [RateLimit(requests: 10, periodMilliseconds: 1000)], maxWait: 150)
        let services = Services([PolicyEntry(name: "default", rateLimit: .on(limit))])
        guard case .send = runTry(try exchange("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", services), services) else {
            Issue.record("the first request goes at once")
            return
        }
        var second = try exchange("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", services)
        guard case .wait(.quota(let wait)) = runTry(second, services) else {
            Issue.record("the second waits for its turn")
            return
        }
        guard case .timer(let ms, _) = wait.kind else {
            Issue.record("a rate's wait is on a timer")
            return
        }
        #expect((95...100).contains(ms), "10/s: about 100 ms after the first")
        second = try exchange("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", services)
        guard
            case .respond(.rateLimited(policy: "default", requests: 10, windowSeconds: 1, retryAfter: 1)) = runTry(
                second, services)
        else {
            Issue.record("the third would wait 200 ms, past max_wait: 429")
            return
        }
        // Another host has a schedule of its own (key: host).
        guard case .send = runTry(try exchange("GET http://b/ HTTP/1.1\r\nHost: b\r\n\r\n", services), services) else {
            Issue.record("another host is not limited by a's schedule")
            return
        }
        let client = RequestClient(peer: "[::1]:5000", address: "::1", mode: .forward, forwarding: nil)
        let request = UpstreamRequest(
            method: "GET", target: try RequestTarget.absolute("http://a/"), headers: RequestHeaderLines.Builder().makeLines(),
            body: .none,
            model: nil)
        #expect(
            QuotaStage.key(
                .client, request.target, try exchange("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", services, client: client))
                == "::1")
        let keyed = try exchange("GET http://a/ HTTP/1.1\r\nHost: a\r\nX-Api-Key: k1\r\n\r\n", services)
        #expect(QuotaStage.key(.header("x-api-key"), request.target, keyed) == "k1")
    }

    @Test func maxConcurrentHoldsAPlaceUntilTheTryEndsAndQueuesTheRest() throws {
        let waitMode = RateLimitSettings(limits: [], maxWait: 1000, learn: false, maxConcurrent: 1)
        let services = Services([
            PolicyEntry(name: "default", rateLimit: .on(waitMode)),
            PolicyEntry(
                name: "r.example",
                rateLimit: .on(RateLimitSettings(limits: [], onLimit: .reject, learn: false, maxConcurrent: 1))),
        ])
        func fresh(_ host: String) throws -> (Exchange, Owner) {
            let e = try exchange("GET http://\(host)/ HTTP/1.1\r\nHost: \(host)\r\n\r\n", services)
            let owner = Owner()
            e.owner = owner
            return (e, owner)
        }
        let (first, firstOwner) = try fresh("a")
        guard case .send = runTry(first, services), let slot = firstOwner.quotaSlot else {
            Issue.record("the first goes and holds the place")
            return
        }
        #expect(slot.key == "a" && slot.limit == 1)
        let (second, _) = try fresh("a")
        guard case .wait(.quota(let wait)) = runTry(second, services), case .slot = wait.kind else {
            Issue.record("the second waits in line")
            return
        }
        #expect(wait.limit == "max_concurrent 1")
        // Reject mode: no line, 429 at once; the access log's record says why.
        _ = runTry(try fresh("r.example").0, services)
        let (refused, _) = try fresh("r.example")
        guard case .respond(.concurrencyLimited(policy: "r.example", limit: 1)) = runTry(refused, services) else {
            Issue.record("over max_concurrent in reject mode: 429")
            return
        }
        #expect(refused.summary.rateLimit == RateLimitRecord(decision: .rejected, limit: "max_concurrent 1"))
    }

    @Test func aHostWithoutTrustIsRefusedBeforeAnyConnection() throws {
        let services = Services()
        services.pipeline = WorkerPipeline(
            Pipeline(policies: PolicyTable(entries: [PolicyEntry(name: "default")], allHostsMustBeEvaluated: true), monitors: []))
        guard
            case .failTry(.trustFailure, _) = runTry(
                try exchange("GET https://a/ HTTP/1.1\r\nHost: a\r\n\r\n", services), services)
        else {
            Issue.record("an https host no evaluator covers is refused")
            return
        }
    }

    /// An adapter that runs on every try: what it was given, and a stamp of the try.
    struct TryStamp: EveryTryAdapter {
        var name: String { "try_stamp" }
        var readsBody: Bool { true }
        func adaptTry(_ request: inout ProxyRequest, _ context: TryContext) throws(AdaptationError) {
            let body = context.body.map { String(decoding: $0, as: UTF8.self) } ?? "none"
            request.headerFields[HTTPField.Name("X-Try")!] = "\(context.attempt) \(context.wallClockMilliseconds) \(body)"
        }
    }

    /// Every-try adapters run in the try stages, after the once-per-exchange ones, on the
    /// request as those left it: the header list the transport sends is made again, with the
    /// body's length, and every try is adapted afresh.
    @Test func adaptersForEveryTryRunOnEachTry() throws {
        let services = Services([
            PolicyEntry(name: "default", adapters: [HeaderAdapter(set: [(HTTPField.Name("X-Once")!, "1")]), TryStamp()])
        ])
        let exchange = try exchange(
            "POST http://a/p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nX-Try: client\r\n\r\n", services)
        #expect(exchange.policy.tryAdapters.map(\.name) == ["try_stamp"])
        #expect(exchange.policy.interceptor.adapters.map(\.name) == ["headers"])
        guard case .wait(.requestBody(.whole)) = RequestBodyStage.enter(exchange, services) else {
            Issue.record("an adapter that reads the body has it read whole")
            return
        }
        var model = ProxyRequest(id: 1, method: "POST", url: "http://a/p", headerFields: [:], body: .length(5))
        model.headerFields[HTTPField.Name("X-Once")!] = "1"
        model.headerFields[HTTPField.Name("X-Try")!] = "client"
        // The body as the connection kept it: read whole.
        let scratch = UnsafeMutableRawPointer.allocate(byteCount: 8, alignment: 1)
        defer { scratch.deallocate() }
        var given = false
        while try exchange.body.read(
            into: scratch, capacity: 8,
            readClient: { buffer, _ in
                defer { given = true }
                if given { return 0 }
                Array("hello".utf8).withUnsafeBytes { buffer.copyMemory(from: $0.baseAddress!, byteCount: 5) }
                return 5
            }) != 0
        {}
        for _ in 1...2 {
            var request = UpstreamRequest(
                method: "POST", target: exchange.target, headers: RequestHeaderLines.Builder().makeLines(), body: .streamed,
                model: model)
            guard case .proceed = TryAdaptersStage.enter(&request, exchange, services) else {
                Issue.record("the try adapters let the try go")
                return
            }
            let lines = request.headers.lines
            #expect(lines.contains("X-Once: 1"))
            #expect(lines.filter { $0.hasPrefix("X-Try:") }.count == 1, "the client's value replaced, not added to")
            #expect(lines.contains { $0.hasPrefix("X-Try: 1 ") && $0.hasSuffix(" hello") }, "\(lines)")
            #expect(request.body == .length(5))
            #expect(request.model?.headerFields[.contentLength] == "5")
        }
    }

    /// A declared body over `max_body` is refused before a byte is read: 413, nothing sent.
    @Test func aBodyOverMaxBodyIsRefusedForASigner() throws {
        var entry = PolicyEntry(name: "default", adapters: [TryStamp()])
        entry.maxBody = 4
        let services = Services([entry])
        let exchange = try exchange("PUT http://a/p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n", services)
        guard case .respond(.bodyTooLargeForAdapter(adapter: "try_stamp", limit: 4)) = RequestBodyStage.enter(exchange, services)
        else {
            Issue.record("413 for a body over max_body")
            return
        }
    }

    // MARK: the response's way back

    /// A transfer the response stages are handed but, without a cache, never touch.
    final class InertTransfer: UpstreamTransfer {
        let target: RequestTarget
        init(_ target: RequestTarget) { self.target = target }
        var responseStarted: Bool { false }
        var framedByClose: Bool { false }
        var cacheFill: CacheFill?
        var extraHeadLines: [UInt8] = []
        var bodyBytesSent: Int64 { 0 }
        var clientFraming: ResponseEncoder.Framing { .close }
        var forwardedHead: UpstreamResponseHead? { nil }
        var resumableTry: (request: UpstreamRequest, route: UpstreamRoute)? { nil }
        var deadlineExceeded: Bool { false }
        var continuing: ResponseEncoder.Framing?
        func start(perTryTimeout: Int) {}
        func cancel() {}
        func forward(keepAlive: Bool) { Issue.record("a response stage forwarded") }
        func follow(_ next: UpstreamRequest) { Issue.record("a response stage followed") }
        func discard() { Issue.record("a response stage discarded") }
        func absorb() { Issue.record("a response stage absorbed") }
        /// What a stage refused the response with, or the head it forwards instead.
        var refused: ProxyError?
        var replacedHead: ResponseHeadCollector?
        func refuse(_ error: ProxyError) { refused = error }
        func replaceHead(_ head: ResponseHeadCollector) { replacedHead = head }
        /// The limit a stage asked the body to be kept under (`collect`).
        var collectLimit: Int?
        func collect(limit: Int) { collectLimit = limit }
        func detach(to delegate: any UpstreamTransferDelegate) {}
        func resumeDownload() {}
        func resumeUpload() {}
    }

    static func responseHead(_ lines: [String]) -> UpstreamResponseHead {
        var head = ResponseHeadCollector()
        for line in lines + [""] { _ = Array((line + "\r\n").utf8).withUnsafeBytes { head.add($0) } }
        return UpstreamResponseHead(collected: head)
    }

    /// Runs the head stages on `lines` for the first try of `exchange`.
    func respond(_ exchange: Exchange, _ services: Services, _ lines: [String]) -> (ResponseVerdict, ResponseHeadContext) {
        guard case .send = runTry(exchange, services) else {
            Issue.record("the try did not go")
            return (
                .proceed,
                ResponseHeadContext(
                    response: Self.responseHead(lines), transfer: InertTransfer(exchange.target), canResendBody: true)
            )
        }
        var context = ResponseHeadContext(
            response: Self.responseHead(lines), transfer: InertTransfer(exchange.target), canResendBody: true)
        return (ResponseChain.runHead(&context, exchange, services), context)
    }

    @Test func theResponseChainIsTheTryStagesInReverse() {
        #expect(ResponseChain.head.map { $0.name } == ["rate_limit", "health", "lua", "decision", "cache"])
        #expect(ResponseChain.end.map { $0.name } == ["rate_limit", "health", "cache"])
    }

    /// The head's verdicts: a 200 passes; a status the retry policy retries is drained; a 429
    /// whose pause `rate_limit.learn` waits for is held (and drained for the next try).
    @Test func theResponseStagesDecideAboutAHead() throws {
        var entry = PolicyEntry(name: "default")
        entry.retry = .on(RetryPolicy(limit: 2, budget: nil))
        entry.rateLimit = .on(RateLimitSettings(limits: [RateLimit(requests: 1000, periodMilliseconds: 1000, burst: 100)]))
        let services = Services([entry])
        let (ok, _) = respond(try exchange("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", services), services, ["HTTP/1.1 200 OK"])
        guard case .proceed = ok else {
            Issue.record("a 200 goes to the client")
            return
        }
        let (retried, _) = respond(
            try exchange("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", services), services, ["HTTP/1.1 503 Busy"])
        guard case .discard = retried else {
            Issue.record("a 503 the policy retries is drained")
            return
        }
        let (held, context) = respond(
            try exchange("GET http://a/x HTTP/1.1\r\nHost: a\r\n\r\n", services), services,
            ["HTTP/1.1 429 Slow down", "Retry-After: 2"])
        #expect(context.heldByOrigin, "the origin's pause is learned")
        guard case .discard = held else {
            Issue.record("a held 429 is drained and tried again after the pause")
            return
        }
    }

    /// The end of a try gives its `max_concurrent` place back.
    @Test func theEndOfATryGivesItsPlaceBack() throws {
        var entry = PolicyEntry(name: "default")
        entry.rateLimit = .on(RateLimitSettings(limits: [], maxConcurrent: 1))
        let services = Services([entry])
        let first = try exchange("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", services)
        guard case .send = runTry(first, services), owner.quotaSlot != nil else {
            Issue.record("the first try goes")
            return
        }
        ResponseChain.runEnd(.complete, first, services)
        #expect(owner.quotaSlot == nil)
        let second = try exchange("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", services)
        guard case .send = runTry(second, services) else {
            Issue.record("the place was given back")
            return
        }
    }

    static let sha256Hash = "$5$saltsalt$/B/a8TyziOAL7A5QHAhQtwjk3lO8brshalLojtxVb.8"
}

/// glibc's `malloc_usable_size` (declared in `malloc.h`, which Glibc's module does not export).
@_silgen_name("malloc_usable_size") private func mallocUsableSize(_ pointer: UnsafeMutableRawPointer?) -> Int

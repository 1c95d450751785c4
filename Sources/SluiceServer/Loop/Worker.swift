import CLibEvent
import CShims
import HTTPTypes
import SluiceCore
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// One event-loop thread: its own `event_base`, its own listening sockets (`SO_REUSEPORT`,
/// so the kernel spreads connections across workers), its own libcurl multi and upstream
/// connection pool, and every client connection it accepted.
///
/// Threading: built on the main thread (so bind errors surface before anything runs), then
/// handed to its thread, which alone touches it from then on. Other threads reach it only
/// through its `StopHandle`: its mailbox, and the `LoopWake`s that wake the loop for it.
final class Worker {
    let index: Int
    /// Limits, timeouts, access rules and TLS: fixed for the process's life.
    let config: ServerConfiguration
    /// Policies and monitors; replaced on reload (exchanges keep the one they started with).
    private(set) var pipeline: WorkerPipeline
    private var requestCounter: UInt64 = 0
    let base: OpaquePointer
    /// The libcurl transport: this worker's multi and its connection pool, made by the first
    /// try (or CONNECT tunnel, upgrade, side fetch) that uses libcurl, so that a worker whose
    /// tries all go through the native transport never opens libcurl (`CurlShare`).
    var session: UpstreamSession {
        if let made = curlSession { return made }
        let made = UpstreamSession(base: base, share: curlShare, limits: config.upstream)
        curlSession = made
        return made
    }
    /// The session once made.
    private var curlSession: UpstreamSession?
    /// The server's libcurl share handle, for the session.
    private let curlShare: CurlShare
    /// The native transport: this worker's HTTP/1.1 keep-alive pool and its DNS
    /// (docs/architecture.md, "Two transports").
    let nativePool: NativeUpstreamPool
    /// What https origins chose by ALPN, for `UpstreamEngine.choose`.
    var tlsProtocols = TLSProtocolMemory()
    let resolver: Resolver
    /// What adapters see of this worker (token fetches, parking); created after init.
    private(set) var sessionContext: WorkerSession!
    /// `1.1 <pseudonym>`, this process's `Via` entry.
    let via: String
    /// `Via: <via>\r\n`, as response heads carry it.
    let viaLine: [UInt8]
    /// `Via: <via>`, as upstream requests' header lines carry it.
    let viaRequestLine: [UInt8]
    /// Where every upstream request's header lines are built (its buffers keep their capacity).
    var headerBuilder = RequestHeaderLines.Builder()
    let viaPseudonym: String
    /// `<random hex>-`, the start of every `X-Request-Id` this worker makes.
    let requestIdPrefix: String
    /// The interception TLS server, once a policy with `intercept: true` has been loaded.
    let interception: InterceptionSlot
    /// Open listeners by address. A reload that changes only what an address serves (a
    /// route's upstream) keeps the socket: nothing queued on it is dropped.
    private var listeners: [String: Listener] = [:]
    private var reloadEvent: LoopWake<Worker>!
    private var adminEvent: LoopWake<Worker>!
    private var quotaEvent: LoopWake<Worker>!
    /// Tries of this worker waiting for a `max_concurrent` place, by ticket.
    var quotaWaiters: [UInt64: TryHold] = [:]
    /// Shared fills whose transfer goes on without its client (`FillProducer`).
    var fillProducers: [ObjectIdentifier: FillProducer] = [:]
    /// Requests of this worker waiting on another exchange's fetch (`CacheFetch`), by ticket.
    var fillWaiters: [UInt64: ExchangeDriver] = [:]
    var nextFillTicket: UInt64 = 0
    /// Tries of this worker waiting for the fleet's Redis, by ticket.
    var fleetWaiters: [UInt64: TryHold] = [:]
    var nextFleetTicket: UInt64 = 0
    /// Hands a ticket given a place to this worker's loop (`RateLimitTable`; any thread).
    private(set) var quotaWake: @Sendable (UInt64) -> Bool = { _ in false }
    private let mailbox: Mailbox
    let heartbeat = Heartbeat()
    /// Beats `heartbeat`; only when a service manager watches (`ServiceNotifier`).
    private var heartbeatTimer: LoopTimer<Worker>?
    /// `limits.max_connections` and `max_connections_per_client`, shared by every worker.
    let connectionLimits: ConnectionLimits
    /// The process's shared cache (`cache_store`), nil without one: then no request is
    /// looked up at all.
    let cacheStore: CacheStore?
    /// The shared cache's disk tier (`cache_store.disk`), opened once by the server (it holds
    /// the directory's lock) and shared by every worker.
    let diskTier: DiskCacheTier?
    /// `limits.max_in_flight_upstream`: this worker's upstream slots and their queue.
    private(set) var upstreamGate: UpstreamGate!
    /// Every origin's circuit breaker (`health:`), shared by every worker.
    /// The process's rate-limit schedules (`rate_limit:`), shared with the other workers.
    let rateLimits: RateLimitTable
    /// The fleet's shared cache (`fleet.cache`), shared by every worker; nil without it.
    let peers: FleetPeers?
    /// This worker's part of the fleet (`fleet:`): its Redis connection; nil without one.
    let fleet: Fleet?
    let health: UpstreamHealth
    /// The probes of half-open circuits: worker 0 only (nil on the others).
    private var probes: HealthProbes?

    /// One listening socket and what its connections do.
    final class Listener {
        unowned let worker: Worker
        var mode: ListenerMode
        let address: String
        var evListener: OpaquePointer?
        /// The connections taken from it in this pass of the loop.
        var batch = AcceptBatch()
        init(worker: Worker, mode: ListenerMode, address: String) {
            self.worker = worker
            self.mode = mode
            self.address = address
        }
    }

    /// What the service watchdog (`ServiceNotifier`) reads of this worker: beats counted by a
    /// timer on this worker's loop (so a loop that is stuck stops them), and the counts for
    /// systemd's `STATUS=` line. Written by the worker's thread, read by the notifier's.
    final class Heartbeat: Sendable {
        let beats = Atomic<UInt64>(0)
        let exchangesInFlight = Atomic<Int>(0)
        let clientConnections = Atomic<Int>(0)
        /// The loop has ended (a drained worker needs no watchdog).
        let exited = Atomic<Bool>(false)
    }

    /// Where other threads leave work for this worker (a new configuration, admin tasks) and
    /// wake it. Its lock is held while a `LoopWake` of the worker is activated, and the worker
    /// marks it `closed` before it drops those events: nothing is activated after that (a
    /// second SIGTERM, a SIGHUP or an admin request that arrives after this worker drained).
    final class Mailbox: Sendable {
        struct Contents {
            var closed = false
            /// A stop was asked for that exits at once (a second SIGTERM), not a drain.
            var forceStop = false
            var pending: SluiceConfiguration?
            var admin: [AdminTask] = []
            /// `max_concurrent` tickets given a place (`RateLimitTable`'s wake).
            var quotaGrants: [UInt64] = []
            /// Requests waiting on a fetch (`CacheFetch`) whose fetch moved on.
            var fillWakes: [UInt64] = []
        }
        let contents = Mutex(Contents())
    }

    /// What the admin API (`AdminServer`) asks of a worker; run on the worker's loop, each
    /// answered through its gather.
    enum AdminTask: Sendable {
        /// `GET /requests`: the exchanges in flight.
        case list(AdminGather<[AdminExchange]>)
        /// `POST /requests/cancel`: cancel the matching exchanges; answers how many.
        case cancel(AdminCancelFilter, AdminGather<Int>)
        /// `GET /readyz`: the loop answers, and its upstream session is usable.
        case ping(AdminGather<Bool>)
        /// `GET /metrics`: the worker's index, exchanges in flight and client connections.
        case counts(AdminGather<WorkerCounts>)
        /// `GET /fleet`: this worker's connection to the fleet's Redis.
        case fleet(AdminGather<FleetWorkerState>)
        /// `GET /upstreams`: the connections of this worker's native pool, by origin.
        case pools(AdminGather<[UpstreamPoolCount]>)

        /// The answer of a worker whose loop has ended: no exchanges, nothing cancelled, not
        /// ready.
        func answerUnavailable() {
            switch self {
            case .list(let gather): gather.deliver([])
            case .cancel(_, let gather): gather.deliver(0)
            case .ping(let gather): gather.deliver(false)
            case .counts(let gather): gather.deliver(WorkerCounts(index: -1, exchangesInFlight: 0, clientConnections: 0))
            case .fleet(let gather): gather.deliver(FleetWorkerState(worker: -1))
            case .pools(let gather): gather.deliver([])
            }
        }
    }
    private var connections: [ObjectIdentifier: ClientConnection] = [:]
    /// This worker's part of the dashboard's numbers, for refusals at accept (taken on first
    /// use, on the worker's thread: the shards' table lock is not taken per refusal).
    lazy var dashboardShard = DashboardStats.shared.shardForCurrentThread()
    /// Where client reads beyond `ClientSocket.smallRead` land before they are copied into the
    /// connection's input (64 KiB; freed when the worker's loop ends).
    let readSpill = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
    /// Connections with output to write in this loop pass (`scheduleFlush`).
    private var flushQueue: [ClientConnection] = []
    private var flushEvent: LoopWake<Worker>!
    /// Gives a burst's freed heap back to the kernel once the worker is quiet.
    private var heapTrim = HeapTrimSchedule()
    private var heapTrimTimer: LoopTimer<Worker>!
    private var stopEvent: LoopWake<Worker>!
    private var drainTimer: LoopTimer<Worker>?
    private(set) var isDraining = false
    /// Listeners switched off after accept() failed for want of descriptors (`acceptFailed`),
    /// the timer that switches them on again, and whether this worker's accepts have failed
    /// since the process-wide episode (`AcceptFailures`) last ended.
    private var acceptPaused: [Listener] = []
    private var acceptRetryTimer: LoopTimer<Worker>?
    private var acceptTroubled = false
    /// Listeners that accepted in this pass, and the wake that ends their batch
    /// (`AcceptBatch`).
    private var acceptedThisPass: [Listener] = []
    private var acceptPassEnd: LoopWake<Worker>!

    /// A worker's counts for `GET /metrics` (`index` -1: a worker whose loop has ended).
    struct WorkerCounts: Sendable {
        let index: Int
        let exchangesInFlight: Int
        let clientConnections: Int
    }

    /// What other threads may hold of a worker: the events that wake it and its mailbox. The
    /// events are activated only under the mailbox's lock while it is open (the worker drops
    /// them after it closes).
    struct StopHandle: Sendable {
        let event: LoopWake<Worker>.Handle
        let reloadEvent: LoopWake<Worker>.Handle
        let adminEvent: LoopWake<Worker>.Handle
        let quotaEvent: LoopWake<Worker>.Handle
        let mailbox: Mailbox
    }

    /// `heartbeatMilliseconds`: how often the loop beats its `heartbeat` (nil: never).
    init(
        index: Int, configuration: SluiceConfiguration, share: CurlShare, viaPseudonym: String,
        interception: InterceptionSlot, heartbeatMilliseconds: Int? = nil,
        connectionLimits: ConnectionLimits? = nil, health: UpstreamHealth? = nil, rateLimits: RateLimitTable? = nil,
        cacheStore: CacheStore? = nil, diskTier: DiskCacheTier? = nil, fleetShared: FleetShared? = nil,
        peers: FleetPeers? = nil
    ) throws {
        self.index = index
        self.peers = peers
        let health = health ?? UpstreamHealth()
        self.health = health
        self.rateLimits = rateLimits ?? RateLimitTable()
        self.cacheStore = cacheStore
        self.diskTier = diskTier
        self.connectionLimits = connectionLimits ?? ConnectionLimits(configuration.server.limits)
        self.interception = interception
        self.config = configuration.server
        self.pipeline = WorkerPipeline(configuration.pipeline)
        self.mailbox = Mailbox()
        self.viaPseudonym = viaPseudonym
        requestIdPrefix = String(viaPseudonym.dropFirst("sluice-".count)) + "-"
        self.via = "1.1 \(viaPseudonym)"
        viaLine = Array("Via: 1.1 \(viaPseudonym)\r\n".utf8)
        viaRequestLine = Array("Via: 1.1 \(viaPseudonym)".utf8)
        guard let base = LoopBase.make() else { throw ServerError.startup("cannot create an event loop") }
        self.base = base
        curlShare = share
        nativePool = NativeUpstreamPool(base: base, spill: readSpill, limits: configuration.server.upstream)
        fleet = configuration.server.fleet.map {
            Fleet(
                base: base, settings: $0, shared: fleetShared ?? FleetShared(), workerIndex: index, health: health,
                peers: peers)
        }
        resolver = Resolver(base: base)
        upstreamGate = UpstreamGate(
            base: base, workerIndex: index, limits: configuration.server.limits,
            timeouts: configuration.server.timeouts)
        stopEvent = LoopWake(on: base, owner: self, crossThread: true) { worker in
            worker.beginDrain(force: worker.mailbox.contents.withLock { $0.forceStop })
        }
        reloadEvent = LoopWake(on: base, owner: self, crossThread: true) { $0.applyPendingReload() }
        adminEvent = LoopWake(on: base, owner: self, crossThread: true) { $0.runAdminTasks() }
        quotaEvent = LoopWake(on: base, owner: self, crossThread: true) { $0.runQuotaGrants() }
        flushEvent = LoopWake(on: base, owner: self) { $0.flushPass() }
        heapTrimTimer = LoopTimer(on: base, owner: self) { $0.heapTrimCheck() }
        acceptPassEnd = LoopWake(on: base, owner: self) { $0.endAcceptBatches() }
        if let ms = heartbeatMilliseconds {
            let timer = LoopTimer(on: base, owner: self, repeating: true) { $0.beat() }
            timer.arm(milliseconds: ms)
            heartbeatTimer = timer
        }
        for (key, mode, address) in Self.listenerSpecs(configuration.server, peer: config.fleetCache?.listen) {
            try listen(key: key, mode: mode, on: address)
        }
        sessionContext = WorkerSession(worker: self, mailbox: mailbox)
        let handle = stopHandle
        quotaWake = { ticket in Worker.grantQuota(handle, ticket) }
        if index == 0 { probes = HealthProbes(worker: self) }
    }

    var stopHandle: StopHandle {
        StopHandle(
            event: stopEvent.handle, reloadEvent: reloadEvent.handle, adminEvent: adminEvent.handle,
            quotaEvent: quotaEvent.handle, mailbox: mailbox)
    }

    /// A `max_concurrent` ticket was given a place: it goes to this worker's loop (false when
    /// the loop has ended: the place is passed on).
    static func grantQuota(_ handle: StopHandle, _ ticket: UInt64) -> Bool {
        handle.mailbox.contents.withLock { contents in
            guard !contents.closed else { return false }
            contents.quotaGrants.append(ticket)
            handle.quotaEvent.activate()
            return true
        }
    }

    /// A fetch that request `ticket` waits on moved on (it may be another worker's): the wake
    /// goes to this worker's loop (the same event as the quota grants).
    static func wakeFillWaiter(_ handle: StopHandle, _ ticket: UInt64) {
        handle.mailbox.contents.withLock { contents in
            guard !contents.closed else { return }
            contents.fillWakes.append(ticket)
            handle.quotaEvent.activate()
        }
    }

    private func runQuotaGrants() {
        let (tickets, fills) = mailbox.contents.withLock { contents -> ([UInt64], [UInt64]) in
            defer {
                contents.quotaGrants.removeAll()
                contents.fillWakes.removeAll()
            }
            return (contents.quotaGrants, contents.fillWakes)
        }
        // A ticket whose try left (or took its place when its wait ran out) is not here.
        for ticket in tickets { quotaWaiters[ticket]?.slotGranted(ticket) }
        for ticket in fills { fillWaiters.removeValue(forKey: ticket)?.fetchMovedOn() }
    }

    /// Hands `task` to the worker; it runs on the worker's thread at its next loop pass (a
    /// worker whose loop has ended answers at once, `answerUnavailable`).
    static func requestAdmin(_ handle: StopHandle, _ task: AdminTask) {
        let queued = handle.mailbox.contents.withLock { contents -> Bool in
            guard !contents.closed else { return false }
            contents.admin.append(task)
            handle.adminEvent.activate()
            return true
        }
        if !queued { task.answerUnavailable() }
    }

    private func runAdminTasks() {
        let tasks = mailbox.contents.withLock { contents -> [AdminTask] in
            defer { contents.admin.removeAll() }
            return contents.admin
        }
        for task in tasks {
            switch task {
            case .list(let gather):
                gather.deliver(connections.values.compactMap { $0.driver.admin.snapshot(worker: index) })
            case .cancel(let filter, let gather):
                var count = 0
                for connection in Array(connections.values) {
                    guard let exchange = connection.driver.admin.snapshot(worker: index), filter.matches(exchange) else {
                        continue
                    }
                    connection.driver.admin.cancel()
                    count += 1
                }
                gather.deliver(count)
            case .ping(let gather):
                gather.deliver(!isDraining && curlSession?.isUsable != false)
            case .fleet(let gather):
                gather.deliver(fleet.map { FleetWorkerState(worker: index, $0.client) } ?? FleetWorkerState(worker: index))
            case .pools(let gather):
                gather.deliver(nativePool.counts())
            case .counts(let gather):
                gather.deliver(
                    WorkerCounts(
                        index: index, exchangesInFlight: exchangesInFlight,
                        clientConnections: connections.count))
            }
        }
    }

    /// Hands `configuration` to the worker; it applies it on its own thread.
    static func requestReload(_ handle: StopHandle, _ configuration: SluiceConfiguration) {
        handle.mailbox.contents.withLock { contents in
            guard !contents.closed else { return }
            contents.pending = configuration
            handle.reloadEvent.activate()
        }
    }

    /// The `X-Request-Id` for a request that came without one: this process's random tag
    /// (its `Via` pseudonym's) and the request id, in hex — unique across workers and
    /// restarts, and the access log's `id` can be read back from it.
    func makeRequestId(_ id: UInt64) -> String { Self.requestId(prefix: requestIdPrefix, id) }

    /// `prefix` and `id` in lowercase hex, written in place: `prefix + String(id, radix: 16)`
    /// made two strings and a third from them (~750 instructions a request).
    static func requestId(prefix: String, _ id: UInt64) -> String {
        let digits = id == 0 ? 1 : (67 - id.leadingZeroBitCount) / 4
        var prefix = prefix
        return prefix.withUTF8 { head in
            String(unsafeUninitializedCapacity: head.count + digits) { out in
                _ = out.initialize(fromContentsOf: head)
                var rest = id
                for i in stride(from: head.count + digits - 1, through: head.count, by: -1) {
                    let nibble = UInt8(truncatingIfNeeded: rest & 0xF)
                    out[i] = nibble < 10 ? 0x30 + nibble : 0x57 + nibble
                    rest >>= 4
                }
                return head.count + digits
            }
        }
    }

    /// A process-unique request id: the worker index in the top 16 bits, a counter below.
    func nextRequestID() -> UInt64 {
        requestCounter += 1
        perform(heapTrim.activity())
        return UInt64(index) << 48 | requestCounter
    }

    /// The listeners of `server`'s `listen` and `routes`, and the peer listener (`peer`:
    /// `fleet.cache.listen` as started; a reload does not move it).
    static func listenerSpecs(_ server: ServerConfiguration, peer: String?) -> [(String, ListenerMode, String)] {
        server.listen.map { ($0, .forward, $0) } + server.routes.map { ($0.listen, .route($0), $0.listen) }
            + (peer.map { [($0, ListenerMode.peer, $0)] } ?? [])
    }

    /// Swaps in the new pipeline and opens or closes listeners to match the new file.
    private func applyPendingReload() {
        guard
            let configuration = mailbox.contents.withLock({ contents -> SluiceConfiguration? in
                defer { contents.pending = nil }
                return contents.pending
            })
        else { return }
        pipeline = WorkerPipeline(configuration.pipeline, reload: true)
        // States of scripts no policy runs any more are dropped (exchanges in flight keep theirs).
        LuaStateCache.current.retain(only: pipeline.policies.scripts)
        LuaStateCache.current.redactor = pipeline.redactor
        probes?.update()
        upstreamGate.reconfigure(configuration.server.limits, configuration.server.timeouts)
        if isDraining { return }
        let specs = Self.listenerSpecs(configuration.server, peer: config.fleetCache?.listen)
        let wanted = Set(specs.map(\.0))
        for (key, listener) in listeners where !wanted.contains(key) {
            if let l = listener.evListener { evconnlistener_free(l) }
            listeners.removeValue(forKey: key)
            if index == 0 { Log.info("reload: closed listener \(key)") }
        }
        for (key, mode, address) in specs {
            if let existing = listeners[key] {
                existing.mode = mode
                continue
            }
            do {
                try listen(key: key, mode: mode, on: address)
                if index == 0 { Log.info("reload: opened listener \(key)") }
            } catch {
                Log.error("reload: \(error)")
            }
        }
        // Connections verified under the old trusts are not reused: new ones are made with new
        // contexts (a connection still in use keeps its own, and is closed when it is done if
        // its try started under the old configuration).
        nativePool.tlsContexts.removeAll()
        nativePool.closeIdleTLSConnections()
        pipeline.monitor?.handle(.configReloaded(success: true, message: "worker \(index) reloaded"))
    }

    /// The connections with an exchange in flight (for systemd's STATUS= and the admin API).
    private var exchangesInFlight: Int {
        var count = 0
        for connection in connections.values where connection.exchange != nil { count += 1 }
        return count
    }

    private func beat() {
        heartbeat.exchangesInFlight.store(exchangesInFlight, ordering: .relaxed)
        heartbeat.clientConnections.store(connections.count, ordering: .relaxed)
        heartbeat.beats.add(1, ordering: .releasing)
    }

    /// Asks the worker to stop: first call drains, a call with `force` exits at once.
    static func requestStop(_ handle: StopHandle, force: Bool) {
        handle.mailbox.contents.withLock { contents in
            guard !contents.closed else { return }
            if force { contents.forceStop = true }
            handle.event.activate()
        }
    }

    private func listen(key: String, mode: ListenerMode, on address: String) throws {
        var storage = sockaddr_storage()
        var length = Int32(MemoryLayout<sockaddr_storage>.size)
        let parsed = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { evutil_parse_sockaddr_port(address, $0, &length) }
        }
        guard parsed == 0 else { throw ServerError.startup("invalid listen address '\(address)'") }
        let listener = Listener(worker: self, mode: mode, address: address)
        let flags = UInt32(LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_REUSEABLE_PORT | LEV_OPT_CLOSE_ON_EXEC)
        let ev = withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in
                evconnlistener_new_bind(
                    base,
                    { _, fd, sa, _, arg in
                        let listener = Unmanaged<Listener>.fromOpaque(arg!).takeUnretainedValue()
                        listener.worker.accept(fd: fd, address: sa!, mode: listener.mode)
                        listener.worker.countAccept(on: listener)
                    }, Unmanaged.passUnretained(listener).toOpaque(), flags, 1024, sa, length)
            }
        }
        guard let ev else {
            let reason = String(cString: strerror(errno))
            throw ServerError.startup("cannot listen on \(address): \(reason)")
        }
        evconnlistener_set_error_cb(ev) { _, arg in
            let code = errno
            let listener = Unmanaged<Listener>.fromOpaque(arg!).takeUnretainedValue()
            listener.worker.acceptFailed(listener, code: code)
        }
        listener.evListener = ev
        listeners[key] = listener
    }

    private func accept(fd: Int32, address: UnsafeMutablePointer<sockaddr>, mode: ListenerMode) {
        if acceptTroubled { acceptTroubled = AcceptFailures.shared.accepted() }
        perform(heapTrim.activity())
        guard SocketAddress.matches(address, config.access.allowClients) else {
            Log.info("refused client \(SocketAddress.describe(address)): not in access.allow_clients")
            Glibc.close(fd)
            return
        }
        let key = ConnectionLimits.ClientKey(address)
        if let refusal = connectionLimits.admit(key, describe: { SocketAddress.describe(address) }) {
            return refuse(fd: fd, refusal)
        }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        var forwarding: ForwardingFields?
        if case .route(let route) = mode {
            forwarding = ForwardingFields(
                style: route.forwarded, trusted: SocketAddress.matches(address, route.trustedClients),
                clientAddress: SocketAddress.host(address) ?? "unknown")
        }
        let connection = ClientConnection(
            worker: self, mode: mode, fd: fd, peer: SocketAddress.describe(address),
            address: SocketAddress.host(address) ?? "unknown", forwarding: forwarding)
        connection.clientKey = key
        connections[ObjectIdentifier(connection)] = connection
    }

    /// `AcceptBatch`: one more connection taken from `listener` in this pass.
    private func countAccept(on listener: Listener) {
        let action = listener.batch.accepted()
        if action.watchPassEnd {
            acceptedThisPass.append(listener)
            if acceptedThisPass.count == 1 { acceptPassEnd.activate() }
        }
        if action.pause, let ev = listener.evListener { evconnlistener_disable(ev) }
    }

    /// The pass that accepted ended: every listener starts a new batch, and those a full
    /// batch switched off accept again (unless descriptors ran out, the worker drains, or a
    /// reload closed the listener meanwhile).
    private func endAcceptBatches() {
        for listener in acceptedThisPass where listener.batch.passEnded() {
            guard !isDraining, !acceptPaused.contains(where: { $0 === listener }),
                listeners.values.contains(where: { $0 === listener }), let ev = listener.evListener
            else { continue }
            evconnlistener_enable(ev)
        }
        acceptedThisPass.removeAll(keepingCapacity: true)
    }

    private func heapTrimCheck() { perform(heapTrim.check()) }

    private func perform(_ action: HeapTrimSchedule.Action) {
        switch action {
        case .none: break
        case .arm:
            heapTrimTimer.arm(milliseconds: HeapTrimSchedule.quietMilliseconds)
        case .trim:
            sluice_event_release_cached_blocks()
            _ = sluice_heap_trim()
        }
    }

    /// Queues `connection`'s output to be written once the callbacks of this loop pass are
    /// done: a response's head, body and chunk terminator leave in one `sendmsg`, and libcurl
    /// is never inside the call stack of a write that fails and closes a connection.
    func scheduleFlush(_ connection: ClientConnection) {
        flushQueue.append(connection)
        if flushQueue.count == 1 { flushEvent.activate() }
    }

    private func flushPass() {
        // Writing may resume a paused download, which may queue more output: the queue is
        // read by index until it stops growing.
        var i = 0
        while i < flushQueue.count {
            let connection = flushQueue[i]
            i += 1
            connection.flushScheduled = false
            connection.flushOutput()
        }
        flushQueue.removeAll(keepingCapacity: true)
    }

    /// accept() failed for a reason libevent does not retry by itself: EMFILE or ENFILE (out of
    /// descriptors), ENOBUFS or ENOMEM. The listening socket stays readable, so the loop would
    /// call accept() again at once, forever (100 % CPU): the listener is switched off instead,
    /// and on again after `acceptRetryMilliseconds` or as soon as a connection closes. New
    /// connections wait in the kernel's listen queue meanwhile. The log says why once per
    /// episode (`AcceptFailures`).
    private func acceptFailed(_ listener: Listener, code: Int32) {
        acceptTroubled = true
        AcceptFailures.shared.failed(address: listener.address, code: code)
        guard let ev = listener.evListener, !acceptPaused.contains(where: { $0 === listener }) else { return }
        evconnlistener_disable(ev)
        acceptPaused.append(listener)
        if acceptRetryTimer == nil { acceptRetryTimer = LoopTimer(on: base, owner: self) { $0.resumeAccepting() } }
        acceptRetryTimer?.arm(milliseconds: AcceptFailures.retryMilliseconds)
    }

    /// Switches the listeners `acceptFailed` paused on again (those still open).
    private func resumeAccepting() {
        let paused = acceptPaused
        acceptPaused.removeAll()
        acceptRetryTimer?.stop()
        guard !isDraining else { return }
        for listener in paused where listeners.values.contains(where: { $0 === listener }) {
            if let ev = listener.evListener { evconnlistener_enable(ev) }
        }
    }

    func connectionClosed(_ connection: ClientConnection) {
        if connections.removeValue(forKey: ObjectIdentifier(connection)) != nil {
            connectionLimits.release(connection.clientKey)
        }
        if !acceptPaused.isEmpty { resumeAccepting() }
        if isDraining && connections.isEmpty { event_base_loopexit(base, nil) }
    }

    /// Stops accepting, closes idle connections, lets busy ones finish their exchange, and
    /// exits the loop when none is left or `timeouts.drain` has passed.
    private func beginDrain(force: Bool) {
        if force {
            event_base_loopbreak(base)
            return
        }
        guard !isDraining else { return }
        isDraining = true
        closeListeners()
        for connection in Array(connections.values) { connection.drain() }
        if connections.isEmpty {
            event_base_loopexit(base, nil)
            return
        }
        let timer = LoopTimer(on: base, owner: self) { worker in
            Log.warning("worker \(worker.index): drain timeout, closing \(worker.connections.count) connection(s)")
            event_base_loopbreak(worker.base)
        }
        timer.arm(milliseconds: config.timeouts.drain)
        drainTimer = timer
    }

    private func closeListeners() {
        for listener in listeners.values { if let l = listener.evListener { evconnlistener_free(l) } }
        listeners.removeAll()
    }

    /// Runs the loop on the calling thread until it drains or is stopped, then closes what
    /// is left.
    func run() {
        LuaStateCache.current.redactor = pipeline.redactor
        fleet?.start()
        event_base_dispatch(base)
        for connection in Array(connections.values) { connection.close() }
        for producer in Array(fillProducers.values) { producer.cancel() }
        fillProducers.removeAll()
        closeListeners()
        drainTimer = nil
        acceptRetryTimer = nil
        // From here on no thread activates this worker's events (see `Mailbox`); admin tasks
        // that arrived too late are answered as a stopped worker's.
        let late = mailbox.contents.withLock { contents -> [AdminTask] in
            contents.closed = true
            defer { contents.admin.removeAll() }
            return contents.admin
        }
        for task in late { task.answerUnavailable() }
        // The fleet first: what its pending answers start (a probe, a token fetch) still finds
        // everything open.
        fleet?.close()
        probes?.close()
        heartbeat.exited.store(true, ordering: .releasing)
        flushQueue.removeAll()
        upstreamGate.close()
        sessionContext.close()
        nativePool.shutdown()
        resolver.shutdown()
        curlSession?.shutdown()
        readSpill.deallocate()
        // Last: every event of this loop is freed (the session's went with its sockets); the
        // worker's own go now.
        stopEvent = nil
        reloadEvent = nil
        adminEvent = nil
        quotaEvent = nil
        flushEvent = nil
        heapTrimTimer = nil
        acceptPassEnd = nil
        acceptedThisPass.removeAll()
        heartbeatTimer = nil
        event_base_free(base)
    }
}

public enum ServerError: Error, CustomStringConvertible {
    case startup(String)
    /// The interception CA (`sluice ca …`, or a configuration that intercepts).
    case ca(CAError)
    public var description: String {
        switch self {
        case .startup(let message): return message
        case .ca(let error): return error.description
        }
    }
}

/// What the request stages use of their worker (`RequestStage`).
extension Worker: StageServices {
    var adapterSession: any SessionContext { sessionContext }
    var upstreamPerTryTimeout: Int { config.timeouts.upstreamPerTry }
    var totalTimeout: Int? { config.timeouts.total }

    func headerLines(for fields: HTTPFields) -> RequestHeaderLines {
        ForwardedHeaders.requestLines(for: fields, viaLine: viaRequestLine, builder: &headerBuilder)
    }

    func headerLines(for exchange: Exchange, edits: HeaderEditPlan?) -> RequestHeaderLines {
        ForwardedHeaders.requestLines(
            for: exchange.head, viaLine: viaRequestLine, edits: edits, requestId: exchange.generatedRequestId,
            forwarding: exchange.client.forwarding, builder: &headerBuilder)
    }

    func scriptLines(for exchange: Exchange, edits: HeaderEditPlan?) -> RequestHeaderLines.Builder {
        ForwardedHeaders.fieldLines(of: exchange, edits: edits, builder: &headerBuilder)
        return headerBuilder
    }

    func scriptedLines(_ edits: LuaLineEdits) -> RequestHeaderLines {
        headerBuilder.finishScripted(edits, viaLine: viaRequestLine)
    }

    func originChoseHTTP1(_ target: RequestTarget) -> Bool {
        tlsProtocols.choseHTTP1(host: target.host, port: target.port, now: MonotonicClock.milliseconds())
    }

    func admitUpstream(_ waiter: any UpstreamSlotWaiter) -> UpstreamGate.Answer {
        upstreamGate.admit(waiter)
    }

    func revalidateInBackground(
        _ object: CacheObject, _ cache: CacheExchange, token: UInt64, validators: [CacheLookup.Validator],
        hostHeader: String?, as admitted: BackgroundTry
    ) {
        CacheRevalidation.start(
            object, url: cache.url, token: token, validators: validators,
            requestFields: cache.requestFields, hostHeader: hostHeader,
            modification: cache.modification, store: cache.store, worker: self, as: admitted)
    }
}

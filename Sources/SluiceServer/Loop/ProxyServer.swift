import CCurl
import CLibEvent
import CShims
import SluiceConfig
import SluiceCore
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A running Sluice: N worker threads, each with its own event loop, listeners and upstream
/// session, sharing only the immutable configuration and libcurl's DNS/TLS-session share
/// handle.
///
/// Threading: `start()` and `wait()` are called from one controlling thread (the CLI's main
/// thread, or a library user's); `stop()` may be called from any thread.
public final class ProxyServer: @unchecked Sendable {
    // @unchecked: the mutable state (`threads`, `stopHandles`) is written only by `start()`
    // before any other call, and read afterwards.
    public let configuration: SluiceConfiguration
    public var config: ServerConfiguration { configuration.server }
    /// The file `reload()` re-reads; nil for an in-process server built from values.
    public let configPath: String?
    /// The interceptor kinds a reload of `configPath` may name (an embedding program's own
    /// kinds with the built-in ones, docs/library.md).
    public let kinds: InterceptorRegistry
    private var threads: [pthread_t] = []
    private var stopHandles: [Worker.StopHandle] = []
    private var started = false
    /// The configuration last applied (start or reload).
    private let current: Mutex<SluiceConfiguration>
    /// One reload at a time (SIGHUP and the admin API's `POST /reload` may race).
    private let reloading = Mutex(())
    /// The admin listener, when `admin:` is configured (set by `start()`).
    private var admin: AdminServer?
    /// Loaded at start, or at the first reload that intercepts; kept for the process's life.
    private let interception = InterceptionSlot()
    /// 1 for the configuration started with, plus one per applied reload.
    private let generation = Atomic<Int>(1)
    public var configurationGeneration: Int { generation.load(ordering: .relaxed) }
    /// systemd's notification socket, when `runUntilSignalled` runs under a service manager
    /// that set one (written before `start()`, read-only afterwards).
    private(set) var notifier: ServiceNotifier?
    /// Every worker's heartbeat (set by `start()`).
    private var heartbeats: [Worker.Heartbeat] = []
    /// `limits.max_connections` and `max_connections_per_client`, shared by every worker.
    let connectionLimits: ConnectionLimits
    /// Every origin's circuit breaker (`health:`), shared by every worker; a reload keeps the
    /// state of origins whose `health:` did not change.
    public let health = UpstreamHealth()
    /// Every policy's rate-limit schedules (`rate_limit:`), shared by every worker: a limit
    /// holds for the process. A reload keeps the schedules of limits it did not change.
    public let rateLimits: RateLimitTable
    /// What every worker knows of the fleet (`fleet:`): the instances alive, the fallbacks.
    let fleetShared = FleetShared()
    /// The fleet's shared cache (`fleet.cache`): one replay guard for every worker.
    let fleetPeers: FleetPeers?
    /// The shared cache every worker uses (`cache_store`), made once: it outlives reloads.
    let cacheStore: CacheStore?
    /// The shared cache's disk tier (`cache_store.disk`): opened by `start()` (it takes the
    /// directory's lock and scans it), then kept for the process's life — a reload never opens
    /// it again.
    private(set) var diskTier: DiskCacheTier?
    /// libcurl's share handle (DNS cache, TLS sessions) of every worker's session: made by the
    /// first session, freed by `wait()` once no worker thread is left to use it.
    private let share = CurlShare()

    /// Bound once per process: libevent's allocations (a per-thread cache of its 2 and 4 KiB
    /// buffer blocks, `sluice_event_cache_buffer_blocks`) and its locking (libevent's global
    /// state and the admin loop's; a worker's loop takes none, `LoopBase`). (libcurl's global
    /// state is set up when libcurl is first opened, CShims' curl_loader.c.)
    private static let globalSetup: Void = {
        signal(SIGPIPE, SIG_IGN)
        sluice_event_cache_buffer_blocks()
        evthread_use_pthreads()
    }()

    public init(configuration: SluiceConfiguration, configPath: String? = nil, kinds: InterceptorRegistry = .builtIn) {
        self.configuration = configuration
        self.configPath = configPath
        self.kinds = kinds
        current = Mutex(configuration)
        connectionLimits = ConnectionLimits(configuration.server.limits)
        rateLimits = RateLimitTable(capacity: configuration.server.limits.rateLimitKeys)
        cacheStore = configuration.server.cacheStore.map(CacheStore.init)
        let hasRedis = configuration.server.fleet != nil
        fleetPeers = configuration.server.fleetCache.map { FleetPeers($0, redis: hasRedis) }
    }

    /// A server without policies or monitors.
    public convenience init(config: ServerConfiguration) {
        self.init(configuration: SluiceConfiguration(server: config))
    }

    /// The number of worker threads `workers: auto` means here: one per online core.
    public static var coreCount: Int { max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))) }

    /// Binds every listener on every worker, then starts the worker threads. Throws (with
    /// nothing left running) when an address cannot be bound.
    public func start() throws {
        precondition(!started, "ProxyServer.start() called twice")
        _ = Self.globalSetup
        for address in Self.listenAddresses(config) { try Self.checkAddressIsFree(address) }
        if let admin = config.admin { try Self.checkAddressIsFree(admin.listen) }
        if let peer = config.fleetCache?.listen { try Self.checkAddressIsFree(peer) }
        try prepareTLS(for: configuration)
        if let disk = config.cacheStore?.disk {
            do {
                let tier = try DiskCacheTier(directory: disk.path, capacity: UInt64(disk.size)) { Log.warning($0) }
                let scan = tier.startScan
                let usage = tier.usage
                Log.info(
                    "disk cache \(disk.path): \(usage.entries) entries, \(usage.bytes) bytes kept; "
                        + "\(scan.dropped) dropped, \(scan.temporaries) unfinished writes removed, \(scan.evicted) evicted")
                diskTier = tier
            } catch {
                throw ServerError.startup("cache_store.disk.path: \(error.description)")
            }
        }
        let count = config.workers ?? Self.coreCount
        let pseudonym = "sluice-" + String(UInt32.random(in: 0x1000_0000...UInt32.max), radix: 16)
        var workers: [Worker] = []
        do {
            for i in 0..<count {
                workers.append(
                    try Worker(
                        index: i, configuration: configuration, share: share, viaPseudonym: pseudonym,
                        interception: interception,
                        heartbeatMilliseconds: notifier?.heartbeatMilliseconds,
                        connectionLimits: connectionLimits, health: health, rateLimits: rateLimits,
                        cacheStore: cacheStore, diskTier: diskTier, fleetShared: fleetShared, peers: fleetPeers))
            }
        } catch {
            // The workers made so far never ran: freeing them ends their sessions' use of it.
            workers.removeAll()
            share.close()
            throw error
        }
        stopHandles = workers.map(\.stopHandle)
        heartbeats = workers.map(\.heartbeat)
        if let settings = config.admin {
            admin = try AdminServer(server: self, settings: settings, workers: stopHandles)
        }
        for worker in workers {
            var thread = pthread_t()
            let box = Unmanaged.passRetained(worker).toOpaque()
            let rc = pthread_create(
                &thread, nil,
                { arg in
                    Unmanaged<Worker>.fromOpaque(arg!).takeRetainedValue().run()
                    return nil
                }, box)
            guard rc == 0 else { throw ServerError.startup("cannot start worker thread: \(String(cString: strerror(rc)))") }
            // `top -H`, `ps -L` and the watchdog's log name workers by their index. Named here,
            // before start returns (and so before READY=1), not by the thread itself, which may
            // not have run yet when systemd or a test first looks.
            sluice_name_thread(thread, "sluice-w\(worker.index)")
            threads.append(thread)
        }
        started = true
        if let admin {
            admin.start()
            Log.info("admin API on \(admin.address)")
        }
        if let peer = config.fleetCache?.listen { Log.info("fleet.cache: peer listener on \(peer)") }
        Log.info(
            "listening on \(config.listen.joined(separator: ", ")) with \(count) worker(s)"
                + (sluice_curl_loaded() != 0 ? ", libcurl \(String(cString: sluice_curl_version()))" : "")
        )
    }

    static func listenAddresses(_ server: ServerConfiguration) -> [String] {
        server.listen + server.routes.map(\.listen)
    }

    /// Workers bind with SO_REUSEPORT, which would let a second Sluice (or anything else of
    /// the same user) share a port silently and receive half the connections. A plain bind
    /// first makes "address in use" an error, as operators expect.
    static func checkAddressIsFree(_ address: String) throws {
        var storage = sockaddr_storage()
        var length = Int32(MemoryLayout<sockaddr_storage>.size)
        let parsed = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { evutil_parse_sockaddr_port(address, $0, &length) }
        }
        guard parsed == 0 else { throw ServerError.startup("invalid listen address '\(address)'") }
        let fd = socket(Int32(storage.ss_family), Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw ServerError.startup("cannot listen on \(address): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        let rc = withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(length)) }
        }
        guard rc == 0 else { throw ServerError.startup("cannot listen on \(address): \(String(cString: strerror(errno)))") }
    }

    /// Stops accepting and lets in-flight exchanges finish (up to `timeouts.drain`); with
    /// `force`, every loop exits at once. Safe from any thread, and more than once.
    public func stop(force: Bool = false) {
        for handle in stopHandles { Worker.requestStop(handle, force: force) }
    }

    /// SIGTERM, SIGINT (drain), SIGHUP (reload) and SIGUSR1 (reopen the log files).
    static var controlSignals: sigset_t {
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGTERM)
        sigaddset(&set, SIGINT)
        sigaddset(&set, SIGHUP)
        sigaddset(&set, SIGUSR1)
        return set
    }

    /// Blocks the control signals in the calling thread and every thread it creates later;
    /// the CLI calls it first thing, before any thread exists.
    public static func blockControlSignals() {
        var set = controlSignals
        pthread_sigmask(SIG_BLOCK, &set, nil)
    }

    /// Blocks until every worker thread has exited, then flushes the logs.
    public func wait() {
        for thread in threads { pthread_join(thread, nil) }
        threads.removeAll()
        admin?.stop()
        admin?.join()
        // Every worker's session has ended (`Worker.run`), so no easy handle uses it any more.
        share.close()
        LogSink.flushAll()
    }

    /// The configuration last applied (at start, or by the last reload that took).
    public var currentConfiguration: SluiceConfiguration { current.withLock { $0 } }

    /// Applies a new pipeline, listeners and routes to every worker. Safe from any thread.
    /// Server settings other than `listen` and `routes` are kept as started (they need a
    /// restart); a change to them is logged.
    @discardableResult
    public func reload(with new: SluiceConfiguration) -> Bool {
        reloading.withLock { _ in apply(new) == nil }
    }

    /// Applies `new`, or returns why it cannot be (logged; nothing changed).
    private func apply(_ new: SluiceConfiguration) -> String? {
        var fixed = new.server
        fixed.listen = config.listen
        fixed.routes = config.routes
        fixed.logFormat = config.logFormat
        fixed.logLevel = config.logLevel
        fixed.tls.allHostsMustBeEvaluated = config.tls.allHostsMustBeEvaluated  // part of the policies
        Self.keepLoadLimits(of: config, in: &fixed)  // these apply on reload
        let cacheReload = FleetCacheReload(running: config.fleetCache, new: new.server.fleetCache)
        fixed.fleetCache = cacheReload.comparable
        for message in cacheReload.restartNeeded { Log.warning("reload: \(message)") }
        if fixed != config {
            Log.warning(
                "reload: workers, limits, timeouts, access, tls.ca_file, tls.ca_dir, admin, cache_store and fleet changes need a restart; kept the running values"
            )
        }
        let running = Set(Self.listenAddresses(current.withLock { $0.server }))
        do {
            for address in Self.listenAddresses(new.server) where !running.contains(address) {
                try Self.checkAddressIsFree(address)
            }
            try prepareTLS(for: new)
        } catch {
            Log.error("reload failed, keeping the running configuration: \(error)")
            return "\(error)"
        }
        // What runs now: the new pipeline, listeners and routes; every other server setting
        // as started.
        var applied = new
        applied.server = config
        applied.server.listen = new.server.listen
        applied.server.routes = new.server.routes
        applied.server.logFormat = new.server.logFormat
        applied.server.logLevel = new.server.logLevel
        Self.keepLoadLimits(of: new.server, in: &applied.server)
        applied.server.fleetCache = cacheReload.applied
        if let applying = cacheReload.applied { fleetPeers?.reload(applying) }
        connectionLimits.update(new.server.limits)
        let policies = new.pipeline.policies
        health.reconcile { policies.match(host: $0.host).health }
        current.withLock { $0 = applied }
        Log.apply(new.server)
        for handle in stopHandles { Worker.requestReload(handle, new) }
        generation.add(1, ordering: .relaxed)
        return nil
    }

    /// Copies the limits a reload applies (`ConnectionLimits`, `UpstreamGate`) from `source`.
    static func keepLoadLimits(of source: ServerConfiguration, in server: inout ServerConfiguration) {
        server.limits.maxConnections = source.limits.maxConnections
        server.limits.maxConnectionsPerClient = source.limits.maxConnectionsPerClient
        server.limits.maxInFlightUpstream = source.limits.maxInFlightUpstream
        server.limits.upstreamQueue = source.limits.upstreamQueue
        server.timeouts.upstreamQueue = source.timeouts.upstreamQueue
    }

    /// Loads the interception CA when a policy intercepts and it is not loaded yet, and warns
    /// about every policy that turns verification off.
    private func prepareTLS(for configuration: SluiceConfiguration) throws(ServerError) {
        let policies = configuration.pipeline.policies
        for name in policies.insecurePolicies {
            Log.warning(
                "policy '\(name)': trust is disabled (insecure: true): upstream certificates are NOT verified for its hosts")
        }
        for (name, directives) in policies.cacheOverrulingPolicies {
            Log.warning(
                "policy '\(name)': the shared cache IGNORES the origin's \(directives.joined(separator: ", ")) "
                    + "(cache.modify.ignore_origin_directives): such responses are stored and served to every client")
        }
        guard policies.intercepts, interception.current == nil else { return }
        let directory = config.tls.caDir ?? LocalCA.defaultDirectory()
        let ca = try LocalCA.load(directory: directory)
        interception.set(try TLSInterception(ca: ca))
        Log.info("interception: signing leaves with \(ca.certificatePath) (SHA-256 \(ca.fingerprint))")
    }

    /// What a reload of `configPath` did.
    public struct ReloadResult: Sendable {
        public var applied: Bool
        /// Why it was refused: every located error of the file (`file:line:col: …`), or the
        /// reason the server could not apply it.
        public var errors: [String]
        /// The configuration generation serving now.
        public var generation: Int
    }

    /// Re-reads `configPath` (SIGHUP). An invalid file changes nothing and its errors are
    /// logged with file, line and column. Returns whether the new file was applied.
    @discardableResult
    public func reload() -> Bool { reloadFile().applied }

    /// `reload()` with its errors, and with systemd told (`RELOADING=1`, then `READY=1`):
    /// what SIGHUP and the admin API's `POST /reload` do.
    @discardableResult
    public func reloadFile() -> ReloadResult {
        reloading.withLock { _ in
            notifier?.reloading(path: configPath ?? "the embedded default")
            let errors = readAndApply()
            notifier?.reloaded(applied: errors.isEmpty, generation: configurationGeneration)
            SluiceMetrics.shared.recordReload(applied: errors.isEmpty)
            return ReloadResult(applied: errors.isEmpty, errors: errors, generation: configurationGeneration)
        }
    }

    private func readAndApply() -> [String] {
        guard let configPath else {
            Log.info("reload: running the embedded default; nothing to re-read")
            return ["running the embedded default (no --config): nothing to re-read"]
        }
        do {
            let new = try ConfigLoader.load(path: configPath, kinds: kinds)
            if let error = apply(new) { return [error] }
            Log.info("reload: applied \(configPath)")
            return []
        } catch let error as ConfigError {
            for issue in error.issues { Log.error("reload failed, keeping the running configuration: \(issue)") }
            return error.issues.map(\.description)
        } catch {
            Log.error("reload failed, keeping the running configuration: \(error)")
            return ["\(error)"]
        }
    }

    /// Runs until SIGTERM or SIGINT (drain, then return), or a second such signal (return at
    /// once). The calling thread handles the signals; workers never see them.
    public func runUntilSignalled() throws {
        _ = Self.globalSetup
        // Block the signals in every thread, so only the sigwait below receives them.
        Self.blockControlSignals()
        notifier = ServiceNotifier.fromEnvironment()
        try start()
        if let notifier {
            notifier.ready(generation: configurationGeneration)
            notifier.startWatchdog(heartbeats: heartbeats) { self.configurationGeneration }
        }
        let signals = Self.controlSignals
        let waiter = SignalWaiter(server: self, signals: signals)
        var thread = pthread_t()
        pthread_create(
            &thread, nil,
            { arg in
                Unmanaged<SignalWaiter>.fromOpaque(arg!).takeRetainedValue().run()
                return nil
            }, Unmanaged.passRetained(waiter).toOpaque())
        pthread_detach(thread)
        wait()
        notifier?.stopWatchdog()
    }
}

/// Waits for signals on its own thread: SIGHUP reloads, SIGUSR1 reopens the log files; the
/// first SIGTERM/SIGINT drains the server, the second stops it at once.
private final class SignalWaiter: @unchecked Sendable {
    // @unchecked: both properties are immutable and ProxyServer.stop is thread-safe.
    let server: ProxyServer
    let signals: sigset_t

    init(server: ProxyServer, signals: sigset_t) {
        self.server = server
        self.signals = signals
    }

    func run() {
        var set = signals
        var received: Int32 = 0
        var stopping = false
        while true {
            sigwait(&set, &received)
            if received == SIGUSR1 {
                let (reopened, failures) = LogSink.reopenAll()
                for failure in failures { Log.error("SIGUSR1: \(failure); still writing to the old file") }
                Log.info("SIGUSR1: reopened \(reopened) log file(s)")
            } else if received == SIGHUP {
                server.reloadFile()
            } else if !stopping {
                stopping = true
                Log.info("received signal \(received): draining (up to \(server.config.timeouts.drain) ms)")
                server.notifier?.stopping(drainMilliseconds: server.config.timeouts.drain)
                server.stop(force: false)
            } else {
                Log.info("received signal \(received) again: stopping now")
                server.stop(force: true)
                return
            }
        }
    }
}

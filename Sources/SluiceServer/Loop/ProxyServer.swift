#if canImport(Glibc)
import Glibc
#endif
import CCurl
import CLibEvent
import CShims
import SluiceCore

/// A running Sluice: N worker threads, each with its own event loop, listeners and upstream
/// session, sharing only the immutable configuration and libcurl's DNS/TLS-session share
/// handle.
///
/// Threading: `start()` and `wait()` are called from one controlling thread (the CLI's main
/// thread, or a library user's); `stop()` may be called from any thread.
public final class ProxyServer: @unchecked Sendable {
    // @unchecked: the mutable state (`threads`, `workers`) is written only by `start()`
    // before any other call, and read afterwards; `stopHandles` is immutable once set.
    public let config: ServerConfiguration
    private var threads: [pthread_t] = []
    private var stopHandles: [Worker.StopHandle] = []
    private var started = false

    /// Bound once per process: libevent's locking and curl's global state.
    private static let globalSetup: Void = {
        signal(SIGPIPE, SIG_IGN)
        evthread_use_pthreads()
        curl_global_init(Int(CURL_GLOBAL_ALL))
    }()

    public init(config: ServerConfiguration) {
        self.config = config
    }

    /// The number of worker threads `workers: auto` means here: one per online core.
    public static var coreCount: Int { max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))) }

    /// Binds every listener on every worker, then starts the worker threads. Throws (with
    /// nothing left running) when an address cannot be bound.
    public func start() throws {
        precondition(!started, "ProxyServer.start() called twice")
        _ = Self.globalSetup
        guard let share = sluice_share_create() else { throw ServerError.startup("cannot create curl share handle") }
        let count = config.workers ?? Self.coreCount
        let pseudonym = "sluice-" + String(UInt32.random(in: 0x1000_0000...UInt32.max), radix: 16)
        var workers: [Worker] = []
        for i in 0..<count {
            workers.append(try Worker(index: i, config: config, share: share, viaPseudonym: pseudonym))
        }
        stopHandles = workers.map(\.stopHandle)
        for worker in workers {
            var thread = pthread_t()
            let box = Unmanaged.passRetained(worker).toOpaque()
            let rc = pthread_create(&thread, nil, { arg in
                let worker = Unmanaged<Worker>.fromOpaque(arg!).takeRetainedValue()
                worker.run()
                return nil
            }, box)
            guard rc == 0 else { throw ServerError.startup("cannot start worker thread: \(String(cString: strerror(rc)))") }
            threads.append(thread)
        }
        started = true
        Log.info("listening on \(config.listen.joined(separator: ", ")) with \(count) worker(s), libcurl \(String(cString: sluice_curl_version()))")
    }

    /// Stops accepting and lets in-flight exchanges finish (up to `timeouts.drain`); with
    /// `force`, every loop exits at once. Safe from any thread, and more than once.
    public func stop(force: Bool = false) {
        for handle in stopHandles { Worker.requestStop(handle, force: force) }
    }

    /// Blocks until every worker thread has exited.
    public func wait() {
        for thread in threads { pthread_join(thread, nil) }
        threads.removeAll()
    }

    /// Runs until SIGTERM or SIGINT (drain, then return), or a second such signal (return at
    /// once). The calling thread handles the signals; workers never see them.
    public func runUntilSignalled() throws {
        _ = Self.globalSetup
        // Block the signals in every thread, so only the sigwait below receives them.
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGTERM)
        sigaddset(&set, SIGINT)
        pthread_sigmask(SIG_BLOCK, &set, nil)
        try start()
        let signals = set
        let waiter = SignalWaiter(server: self, signals: signals)
        var thread = pthread_t()
        pthread_create(&thread, nil, { arg in
            Unmanaged<SignalWaiter>.fromOpaque(arg!).takeRetainedValue().run()
            return nil
        }, Unmanaged.passRetained(waiter).toOpaque())
        pthread_detach(thread)
        wait()
    }
}

/// Waits for SIGTERM/SIGINT on its own thread: the first drains the server, the second
/// stops it at once.
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
        sigwait(&set, &received)
        Log.info("received signal \(received): draining (up to \(server.config.timeouts.drain) ms)")
        server.stop(force: false)
        sigwait(&set, &received)
        Log.info("received signal \(received) again: stopping now")
        server.stop(force: true)
    }
}

import CSystemd
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// systemd's notification protocol (`sd_notify(3)`), for `sluice run` under a `Type=notify`
/// unit (`systemd/sluice.service`). Present only when the service manager set
/// `NOTIFY_SOCKET`; without it Sluice sends nothing and its workers run no heartbeat timer.
///
/// The messages, one datagram each (`docs/operations.md` lists them; the e2e suite checks
/// the exact sequence):
/// - `READY=1` once every listener of every worker is bound;
/// - `RELOADING=1` with `MONOTONIC_USEC=` when a reload starts, then `READY=1` whether the new
///   file was applied or refused (the running configuration goes on serving either way);
/// - `STOPPING=1` when a drain starts;
/// - `WATCHDOG=1` every half `WatchdogSec=`, and only while every worker's event loop has
///   beaten its heartbeat since the last ping: one stuck loop withholds the ping and systemd
///   restarts the service;
/// - `STATUS=` with the configuration generation, the requests in flight and the client
///   connections, whenever they change.
///
/// Threading: `send` may be called from any thread (`sd_notify` opens a socket per call). The
/// watchdog runs on its own thread from `startWatchdog` until `stopWatchdog`.
final class ServiceNotifier: Sendable {
    /// `WATCHDOG_USEC` as systemd passes it (`sd_watchdog_enabled`), nil when no watchdog.
    let watchdogMicroseconds: UInt64?
    private let stopped = Atomic<Bool>(false)
    /// The last `STATUS=` sent, and why the last reload failed (cleared by one that applies).
    private let status = Mutex<(last: String, reloadFailure: String?)>(("", nil))

    /// The notifier for this process, or nil when no service manager listens.
    static func fromEnvironment() -> ServiceNotifier? {
        guard let socket = getenv("NOTIFY_SOCKET"), socket.pointee != 0 else { return nil }
        var usec: UInt64 = 0
        let watchdog = sd_watchdog_enabled(0, &usec) > 0 && usec > 0 ? usec : nil
        return ServiceNotifier(watchdogMicroseconds: watchdog)
    }

    private init(watchdogMicroseconds: UInt64?) {
        self.watchdogMicroseconds = watchdogMicroseconds
    }

    /// How often workers beat their heartbeat: four beats per watchdog interval, so two fall
    /// between pings; once a second when only `STATUS=` is reported.
    var heartbeatMilliseconds: Int {
        guard let usec = watchdogMicroseconds else { return 1000 }
        return max(10, Int(usec / 4000))
    }

    func send(_ message: String) {
        let rc = sd_notify(0, message)
        if rc < 0 { Log.debug("sd_notify failed: \(String(cString: strerror(-rc)))") }
    }

    func ready(generation: Int) {
        let line = "serving: configuration generation \(generation)"
        status.withLock { $0.last = line }
        send("READY=1\nSTATUS=\(line)")
    }

    func reloading(path: String) {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        let usec = UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1000
        send("RELOADING=1\nMONOTONIC_USEC=\(usec)\nSTATUS=reloading \(path)")
    }

    /// The reload ended, `applied` or refused (the log says why); the server serves `generation`.
    func reloaded(applied: Bool, generation: Int) {
        let failure: String? = applied ? nil : "the last reload failed (see the log)"
        let line = (failure.map { $0 + "; " } ?? "") + "serving: configuration generation \(generation)"
        status.withLock { $0 = (line, failure) }
        send("READY=1\nSTATUS=\(line)")
    }

    func stopping(drainMilliseconds: Int) {
        send("STOPPING=1\nSTATUS=draining (up to \(drainMilliseconds) ms)")
    }

    /// Starts the thread that pings the watchdog (when systemd asked for one) and keeps
    /// `STATUS=` current, reading `heartbeats` and `generation`.
    func startWatchdog(heartbeats: [Worker.Heartbeat], generation: @escaping @Sendable () -> Int) {
        let watch = WatchdogThread(notifier: self, heartbeats: heartbeats, generation: generation)
        var thread = pthread_t()
        pthread_create(
            &thread, nil,
            { arg in
                Unmanaged<WatchdogThread>.fromOpaque(arg!).takeRetainedValue().run()
                return nil
            }, Unmanaged.passRetained(watch).toOpaque())
        pthread_detach(thread)
    }

    /// Ends the watchdog thread at its next tick (at exit: no ping may outlive the workers).
    func stopWatchdog() { stopped.store(true, ordering: .relaxed) }
    fileprivate var isStopped: Bool { stopped.load(ordering: .relaxed) }

    /// The `STATUS=` line for the workers' latest counts, or nil when it has not changed.
    fileprivate func statusUpdate(generation: Int, inFlight: Int, connections: Int) -> String? {
        status.withLock { status -> String? in
            let line =
                (status.reloadFailure.map { $0 + "; " } ?? "")
                + "serving: configuration generation \(generation), requests in flight: \(inFlight), "
                + "client connections: \(connections)"
            if status.last == line { return nil }
            status.last = line
            return line
        }
    }
}

/// The watchdog's thread: every half watchdog interval (or second, without a watchdog) it
/// checks that every live worker beat since the last tick, and pings only if so.
///
/// Threading: its own detached thread; reads the workers' atomics only.
private final class WatchdogThread: @unchecked Sendable {
    // @unchecked: every property is immutable; `lastBeats` is touched by this thread only.
    let notifier: ServiceNotifier
    let heartbeats: [Worker.Heartbeat]
    let generation: @Sendable () -> Int
    private var lastBeats: [UInt64]

    init(notifier: ServiceNotifier, heartbeats: [Worker.Heartbeat], generation: @escaping @Sendable () -> Int) {
        self.notifier = notifier
        self.heartbeats = heartbeats
        self.generation = generation
        lastBeats = heartbeats.map { $0.beats.load(ordering: .acquiring) }
    }

    func run() {
        let intervalUsec = notifier.watchdogMicroseconds.map { $0 / 2 } ?? 1_000_000
        var withheld = false
        while true {
            var pause = timespec(tv_sec: Int(intervalUsec / 1_000_000), tv_nsec: Int(intervalUsec % 1_000_000) * 1000)
            var left = timespec()
            while nanosleep(&pause, &left) != 0 && errno == EINTR { pause = left }
            if notifier.isStopped { return }
            var stuck: [Int] = []
            var inFlight = 0
            var connections = 0
            for (i, heartbeat) in heartbeats.enumerated() {
                let beats = heartbeat.beats.load(ordering: .acquiring)
                if beats == lastBeats[i] && !heartbeat.exited.load(ordering: .acquiring) { stuck.append(i) }
                lastBeats[i] = beats
                inFlight += heartbeat.exchangesInFlight.load(ordering: .relaxed)
                connections += heartbeat.clientConnections.load(ordering: .relaxed)
            }
            var lines: [String] = []
            if notifier.watchdogMicroseconds != nil {
                if stuck.isEmpty {
                    lines.append("WATCHDOG=1")
                    if withheld { Log.info("watchdog: every worker checks in again") }
                    withheld = false
                } else if !withheld {
                    withheld = true
                    Log.error(
                        "watchdog: worker(s) \(stuck.map(String.init).joined(separator: ", ")) did not check in "
                            + "for \(intervalUsec / 1000) ms; withholding the watchdog ping")
                }
            }
            if let status = notifier.statusUpdate(generation: generation(), inFlight: inFlight, connections: connections) {
                lines.append("STATUS=" + status)
            }
            if !lines.isEmpty { notifier.send(lines.joined(separator: "\n")) }
        }
    }
}

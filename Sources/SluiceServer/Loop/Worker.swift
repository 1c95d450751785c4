#if canImport(Glibc)
import Glibc
#endif
import CLibEvent
import SluiceCore

/// One event-loop thread: its own `event_base`, its own listening sockets (`SO_REUSEPORT`,
/// so the kernel spreads connections across workers), its own libcurl multi and upstream
/// connection pool, and every client connection it accepted.
///
/// Threading: built on the main thread (so bind errors surface before anything runs), then
/// handed to its thread, which alone touches it from then on. The main thread only calls
/// `requestStop(_:)`, through libevent's thread-safe `event_active`.
final class Worker {
    let index: Int
    let config: ServerConfiguration
    let base: OpaquePointer
    let session: UpstreamSession
    /// `1.1 <pseudonym>`, this process's `Via` entry.
    let via: String
    let viaPseudonym: String
    private var listeners: [OpaquePointer] = []
    private var connections: [ObjectIdentifier: ClientConnection] = [:]
    private var stopEvent: OpaquePointer!
    private var drainTimer: OpaquePointer?
    private(set) var isDraining = false

    /// What the main thread may hold of a worker: its stop event (thread-safe to activate).
    struct StopHandle: @unchecked Sendable {
        // libevent was set up with evthread_use_pthreads(), which makes event_active safe
        // from any thread; nothing else is reachable through this pointer.
        let event: OpaquePointer
    }

    init(index: Int, config: ServerConfiguration, share: UnsafeMutableRawPointer, viaPseudonym: String) throws {
        self.index = index
        self.config = config
        self.viaPseudonym = viaPseudonym
        self.via = "1.1 \(viaPseudonym)"
        guard let base = event_base_new() else { throw ServerError.startup("cannot create an event loop") }
        self.base = base
        session = UpstreamSession(base: base, share: share)
        let me = Unmanaged.passUnretained(self).toOpaque()
        stopEvent = event_new(base, -1, Int16(EV_PERSIST), { _, what, arg in
            Unmanaged<Worker>.fromOpaque(arg!).takeUnretainedValue().beginDrain(force: what & Int16(EV_SIGNAL) != 0)
        }, me)
        event_add(stopEvent, nil)
        for address in config.listen { try listen(on: address) }
    }

    var stopHandle: StopHandle { StopHandle(event: stopEvent) }

    /// Asks the worker to stop: first call drains, a call with `force` exits at once.
    static func requestStop(_ handle: StopHandle, force: Bool) {
        event_active(handle.event, force ? Int32(EV_SIGNAL) : Int32(EV_READ), 0)
    }

    private func listen(on address: String) throws {
        var storage = sockaddr_storage()
        var length = Int32(MemoryLayout<sockaddr_storage>.size)
        let parsed = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { evutil_parse_sockaddr_port(address, $0, &length) }
        }
        guard parsed == 0 else { throw ServerError.startup("invalid listen address '\(address)'") }
        let flags = UInt32(LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_REUSEABLE_PORT | LEV_OPT_CLOSE_ON_EXEC)
        let listener = withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in
                evconnlistener_new_bind(base, { _, fd, sa, _, arg in
                    Unmanaged<Worker>.fromOpaque(arg!).takeUnretainedValue().accept(fd: fd, address: sa!)
                }, Unmanaged.passUnretained(self).toOpaque(), flags, 1024, sa, length)
            }
        }
        guard let listener else {
            let reason = String(cString: strerror(errno))
            throw ServerError.startup("cannot listen on \(address): \(reason)")
        }
        listeners.append(listener)
    }

    private func accept(fd: Int32, address: UnsafeMutablePointer<sockaddr>) {
        guard SocketAddress.matches(address, config.access.allowClients) else {
            Log.info("refused client \(SocketAddress.describe(address)): not in access.allow_clients")
            Glibc.close(fd)
            return
        }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        let connection = ClientConnection(worker: self, fd: fd, peer: SocketAddress.describe(address))
        connections[ObjectIdentifier(connection)] = connection
    }

    func connectionClosed(_ connection: ClientConnection) {
        connections.removeValue(forKey: ObjectIdentifier(connection))
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
        for listener in listeners { evconnlistener_free(listener) }
        listeners.removeAll()
        for connection in Array(connections.values) { connection.drain() }
        if connections.isEmpty {
            event_base_loopexit(base, nil)
            return
        }
        let ms = config.timeouts.drain
        var tv = timeval(tv_sec: ms / 1000, tv_usec: (ms % 1000) * 1000)
        drainTimer = event_new(base, -1, 0, { _, _, arg in
            let worker = Unmanaged<Worker>.fromOpaque(arg!).takeUnretainedValue()
            Log.warning("worker \(worker.index): drain timeout, closing \(worker.connections.count) connection(s)")
            event_base_loopbreak(worker.base)
        }, Unmanaged.passUnretained(self).toOpaque())
        event_add(drainTimer, &tv)
    }

    /// Runs the loop on the calling thread until it drains or is stopped, then closes what
    /// is left.
    func run() {
        event_base_dispatch(base)
        for connection in Array(connections.values) { connection.close() }
        for listener in listeners { evconnlistener_free(listener) }
        listeners.removeAll()
        if let drainTimer { event_free(drainTimer) }
        event_free(stopEvent)
    }
}

public enum ServerError: Error, CustomStringConvertible {
    case startup(String)
    public var description: String {
        switch self {
        case .startup(let message): return message
        }
    }
}

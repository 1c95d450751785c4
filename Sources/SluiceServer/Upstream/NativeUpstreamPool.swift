import CLibEvent
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// One HTTP/1.1 connection from a worker to an origin address, carrying one request at a
/// time. While it carries one, its socket's events go to that request's
/// `NativeUpstreamTransfer` (`user`); while it waits in the pool, any event — bytes the
/// origin sends unasked, its close, an error — means the connection is no longer usable, and
/// the pool closes it, so a server's close is seen before the connection is reused.
///
/// Threading: owned by its worker's thread; the pool keeps it alive while it is idle, the
/// transfer while it is busy. Its socket's C context is the socket, unretained.
final class UpstreamConnection: ClientSocketOwner {
    /// The pool key: the origin and the address connected to.
    let key: UpstreamAddressKey
    /// The origin, the unit of the connection limit.
    var origin: UpstreamOrigin { key.origin }
    let socket: ClientSocket
    private unowned(unsafe) let pool: NativeUpstreamPool
    /// The transfer using the connection; nil while it is idle in the pool.
    unowned(unsafe) var user: NativeUpstreamTransfer?
    /// Requests this connection has carried to their end.
    var completedRequests = 0
    /// Closes it once it has been idle in the pool for `idleTimeoutMilliseconds` (armed while
    /// idle).
    fileprivate var idleTimer: LoopTimer<UpstreamConnection>?
    private(set) var isClosed = false
    /// The TLS settings the connection was verified under (kept alive with it).
    private let tlsContext: NativeTLSContext?
    var isTLS: Bool { tlsContext != nil }

    init(
        key: UpstreamAddressKey, fd: Int32, pool: NativeUpstreamPool, tls: OpaquePointer? = nil,
        tlsContext: NativeTLSContext? = nil
    ) {
        self.key = key
        self.pool = pool
        self.tlsContext = tlsContext
        socket = ClientSocket(base: pool.base, fd: fd, spill: pool.spill, watchesCloseWhilePaused: false, tls: tls)
        socket.owner = self
        pool.openConnections[NativeUpstreamPool.PoolOrigin(origin: key.origin, tls: tlsContext != nil), default: 0] += 1
    }

    func socketReadable() {
        if let user { user.upstreamReadable() } else { pool.idleConnectionChanged(self) }
    }

    func socketDrained() { user?.upstreamDrained() }

    func socketClosed() {
        if let user { user.upstreamClosed() } else { pool.idleConnectionChanged(self) }
    }

    /// Closes the socket (a reset when `abortive`: an origin mid-response must not read the
    /// end of the connection as a complete request or a graceful goodbye).
    fileprivate func close(abortive: Bool) {
        guard !isClosed else { return }
        isClosed = true
        let counted = NativeUpstreamPool.PoolOrigin(origin: key.origin, tls: isTLS)
        let left = pool.openConnections[counted, default: 1] - 1
        pool.openConnections[counted] = left > 0 ? left : nil
        idleTimer = nil
        socket.close(abortive: abortive)
    }
}

/// The native transport's keep-alive pool, one per worker: idle connections by origin
/// address, the connection limit per origin (`upstream.max_connections_per_host`) and the
/// tries waiting under it. The rules are `UpstreamPoolState`'s (a value, unit-tested); this
/// class performs what it answers — parking a connection with its idle timer, closing one,
/// waking a waiting try — and keeps the response parsers for reuse.
///
/// Connections are keyed by origin, address and — for https — the TLS context they were
/// verified under (`NativeTLSContext`: one per trust, so a reload's new trust never reuses
/// a connection an old one verified). Parent proxies are not part of a key: those tries go
/// to libcurl. A connection goes back to the pool only when its
/// response said it may (`HTTPResponseParser.keepAlive`), its request was sent whole, and
/// nothing else arrived after the response.
///
/// Threading: owned by one worker's event-loop thread; every method and callback runs there.
final class NativeUpstreamPool {
    /// Idle connections kept at most, all origins together (libcurl's pool held 1024).
    static let maxIdleConnections = 1024
    /// An idle connection is closed after this long unused (60 s; nginx's upstream
    /// `keepalive_timeout` is 60 s, libcurl's age limit 118 s). Origins usually close earlier,
    /// which the idle watch sees.
    static let idleTimeoutMilliseconds = 60_000
    /// How often the surplus of idle connections is halved (`UpstreamPoolState.purgeCandidates`;
    /// haproxy's `pool-purge-delay` is 5 s too). Armed only while connections are idle.
    static let purgeMilliseconds = 5_000

    let base: OpaquePointer
    /// The worker's read spill buffer, shared by every socket of the worker.
    let spill: UnsafeMutableRawBufferPointer
    private var state: UpstreamPoolState<UpstreamAddressKey, UpstreamOrigin, UpstreamConnection, NativeUpstreamTransfer>
    private var isShutDown = false
    /// Response parsers kept for reuse, with their buffers' capacity.
    private var parsers: [ResponseParserSlot] = []
    /// Halves the idle surplus every `purgeMilliseconds` while any connection is idle (made on
    /// first need).
    private var purgeTimer: LoopTimer<NativeUpstreamPool>?
    private var purgeArmed = false
    /// The worker's TLS client contexts for https origins.
    let tlsContexts = NativeTLSContexts()
    private static let maxIdleParsers = 128

    init(base: OpaquePointer, spill: UnsafeMutableRawBufferPointer, limits: UpstreamPoolLimits) {
        self.base = base
        self.spill = spill
        state = UpstreamPoolState(maxPerOrigin: limits.maxConnectionsPerHost, maxIdle: Self.maxIdleConnections)
    }

    typealias Grant = UpstreamPoolState<UpstreamAddressKey, UpstreamOrigin, UpstreamConnection, NativeUpstreamTransfer>.Grant

    /// An idle connection to `key` (now the try's), or the right to open one, or a place in
    /// the queue (`connectionAvailable` is called on the try when it may go on).
    func acquire(origin: UpstreamOrigin, key: UpstreamAddressKey, for transfer: NativeUpstreamTransfer) -> Grant {
        let grant = state.acquire(origin: origin, key: key, for: transfer)
        if case .reuse(let connection) = grant {
            connection.idleTimer?.stop()
            connection.user = transfer
        }
        return grant
    }

    /// A try that waited gave up.
    func cancelWait(origin: UpstreamOrigin, for transfer: NativeUpstreamTransfer) {
        state.cancelWait(origin: origin, for: transfer)
    }

    /// The try that was granted a place (nil: its connection never opened) or that owned
    /// `connection` is done with it: parked when `reusable`, else closed (with a reset when
    /// `abortive`).
    func release(_ connection: UpstreamConnection?, origin: UpstreamOrigin, reusable: Bool, abortive: Bool = false) {
        connection?.user = nil
        let usable = reusable && !isShutDown && connection.map { !$0.isClosed } ?? false
        let (action, wake) = state.release(
            connection, key: connection?.key ?? UpstreamAddressKey(origin: origin), origin: origin,
            reusable: usable)
        if let connection {
            switch action {
            case .park: park(connection)
            case .close: connection.close(abortive: abortive)
            }
        }
        if let wake { wake.waiter.connectionAvailable(opening: wake.opening) }
    }

    /// Closes `connection` (it failed before a response) while its try keeps its place under
    /// the limit, to open a new connection in it.
    func discardKeepingSlot(_ connection: UpstreamConnection) {
        connection.user = nil
        connection.close(abortive: false)
    }

    private func park(_ connection: UpstreamConnection) {
        connection.completedRequests += 1
        connection.socket.wantsInput = true
        if connection.idleTimer == nil {
            // Idle too long: the pool closes it. Lazy: armed and stopped on every request.
            connection.idleTimer = LoopTimer(on: base, owner: connection, lazy: true) { $0.socketClosed() }
        }
        connection.idleTimer?.arm(milliseconds: Self.idleTimeoutMilliseconds)
        if !purgeArmed { armPurge() }
    }

    private func armPurge() {
        if purgeTimer == nil { purgeTimer = LoopTimer(on: base, owner: self) { $0.purge() } }
        purgeTimer?.arm(milliseconds: Self.purgeMilliseconds)
        purgeArmed = true
    }

    /// A purge period ended: its surplus of idle connections is closed; the timer stays armed
    /// while any connection is idle.
    private func purge() {
        purgeArmed = false
        for connection in state.purgeCandidates() { idleConnectionChanged(connection) }
        if state.idleCount > 0, !isShutDown { armPurge() }
    }

    /// An idle connection's socket had an event: the origin closed it, or sent bytes nobody
    /// asked for, or its idle time ran out. It is not reused.
    fileprivate func idleConnectionChanged(_ connection: UpstreamConnection) {
        let (removed, wake) = state.closedIdle(connection, key: connection.key, origin: connection.origin)
        guard removed else { return }
        connection.close(abortive: false)
        if let wake { wake.waiter.connectionAvailable(opening: wake.opening) }
    }

    func takeParser() -> ResponseParserSlot {
        parsers.popLast() ?? ResponseParserSlot()
    }

    func recycle(_ slot: ResponseParserSlot) {
        guard parsers.count < Self.maxIdleParsers, !isShutDown else { return }
        parsers.append(slot)
    }

    /// Closes every idle TLS connection (a reload: its trust, or its CA file's contents, may
    /// have changed), handing their places to tries waiting under the limit.
    func closeIdleTLSConnections() {
        for connection in state.idleConnections where connection.isTLS { idleConnectionChanged(connection) }
    }

    /// Idle connections now (for tests and reports).
    var idleConnections: Int { state.idleCount }

    /// An origin and its scheme, as the admin API reports the pool.
    struct PoolOrigin: Hashable {
        let origin: UpstreamOrigin
        let tls: Bool
    }
    /// Connections open (busy or idle) per origin and scheme.
    fileprivate var openConnections: [PoolOrigin: Int] = [:]

    /// Every origin with connections open: how many, and how many of them wait idle
    /// (`GET /upstreams`).
    func counts() -> [UpstreamPoolCount] {
        var idle: [PoolOrigin: Int] = [:]
        for c in state.idleConnections { idle[PoolOrigin(origin: c.origin, tls: c.isTLS), default: 0] += 1 }
        return openConnections.map { key, open in
            UpstreamPoolCount(
                origin: UpstreamHealth.Origin(scheme: key.tls ? "https" : "http", host: key.origin.host, port: key.origin.port)
                    .name,
                open: open, idle: idle[key] ?? 0)
        }
    }

    /// Closes every idle connection; called once by the worker when its loop has ended
    /// (every transfer is detached by then).
    func shutdown() {
        isShutDown = true
        purgeTimer = nil
        purgeArmed = false
        parsers.removeAll()  // with their head timers: no event outlives the loop
        for connection in state.drainIdle() { connection.close(abortive: false) }
    }
}

/// One origin's connections in one worker's pool (`GET /upstreams`, `pools`).
struct UpstreamPoolCount: Sendable {
    /// `scheme://host:port`, as `health:` names an origin.
    let origin: String
    let open: Int
    let idle: Int
}

/// An origin as the pool counts it: host (as written, without brackets) and port.
struct UpstreamOrigin: Hashable {
    let host: String
    let port: Int
}

/// An origin and the address a connection to it was made to: connections are reused only
/// for the same address (a changed DNS answer opens new ones). Built from the bytes of a
/// socket address, without text.
struct UpstreamAddressKey: Hashable {
    let origin: UpstreamOrigin
    private let family: UInt16
    private let port: UInt16
    private let high: UInt64
    private let low: UInt64
    /// The TLS context of an https connection (nil for plain http).
    private let tls: ObjectIdentifier?

    init(origin: UpstreamOrigin, address: sockaddr_storage, tls: ObjectIdentifier? = nil) {
        self.origin = origin
        self.tls = tls
        var a = address
        family = a.ss_family
        switch Int32(a.ss_family) {
        case AF_INET:
            (port, high, low) = withUnsafePointer(to: &a) {
                $0.withMemoryRebound(to: sockaddr_in.self, capacity: 1) {
                    ($0.pointee.sin_port, 0, UInt64($0.pointee.sin_addr.s_addr))
                }
            }
        case AF_INET6:
            (port, high, low) = withUnsafePointer(to: &a) {
                $0.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { sin6 in
                    var bytes = sin6.pointee.sin6_addr
                    let (h, l) = withUnsafeBytes(of: &bytes) {
                        (
                            $0.loadUnaligned(fromByteOffset: 0, as: UInt64.self),
                            $0.loadUnaligned(fromByteOffset: 8, as: UInt64.self)
                        )
                    }
                    return (sin6.pointee.sin6_port, h, l)
                }
            }
        default:
            (port, high, low) = (0, 0, 0)
        }
    }

    /// No address (a place granted for a connection that never opened).
    init(origin: UpstreamOrigin) {
        self.origin = origin
        family = 0
        port = 0
        high = 0
        low = 0
        tls = nil
    }

    /// The address's words, not the host's text: the pool looks a key up twice per request,
    /// and hashing the host name was most of it. Names that share an address share a hash
    /// and are told apart by `==`, which compares everything.
    func hash(into hasher: inout Hasher) {
        hasher.combine(UInt64(family) << 16 | UInt64(port))
        hasher.combine(high)
        hasher.combine(low)
        hasher.combine(tls)
    }
}

/// A response parser held by reference: a transfer takes one from its pool, which keeps them
/// for reuse with their buffers' capacity. By reference, a try neither copies the parser (309
/// bytes) out of the pool nor back, and its transfer stays within malloc's per-thread cache.
///
/// The slot also keeps the try's wait for its response head, a lazy timer made once per
/// slot: a try re-arms it instead of making and freeing a libevent event.
///
/// Threading: its pool's and its transfer's, on their worker's thread.
final class ResponseParserSlot {
    var parser = HTTPResponseParser()
    /// The try holding the slot, told when its response head is late; nil in the pool (the
    /// try's `deinit` clears it, so the timer never calls a freed try).
    unowned(unsafe) var transfer: NativeUpstreamTransfer?
    private var headTimer: LoopTimer<ResponseParserSlot>?

    /// Arms the wait for the response head of `transfer`'s try.
    func armHeadTimer(on base: OpaquePointer, for transfer: NativeUpstreamTransfer, milliseconds: Int) {
        self.transfer = transfer
        if headTimer == nil { headTimer = LoopTimer(on: base, owner: self, lazy: true) { $0.transfer?.headTimedOut() } }
        headTimer?.arm(milliseconds: milliseconds)
    }

    func stopHeadTimer() { headTimer?.stop() }
}

import SluiceCore
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// `limits.max_connections` (client connections open at once, every worker together) and
/// `limits.max_connections_per_client` (per client IP address). Checked when a connection is
/// accepted and released when it closes — never per request. A connection beyond a limit is
/// answered at accept with a pre-written `503` (`Retry-After: 1`, `Connection: close`),
/// without reading its request, and closed (`Worker.refuse`): an HTTP client understands a 503,
/// where a bare close looks like a network failure. Each refusal is counted
/// (`sluice_connections_refused_total`); the log has one line when refusing starts and one
/// when it stops (with how many were refused), not one per connection.
///
/// `max_connections: auto` (the default) is `automaticMaximum`: half of the open-file limit
/// left after a reserve, since every client connection may hold an upstream socket too.
/// Both limits apply again on reload (`update`); connections already open stay.
///
/// Threading: one per process, made by `ProxyServer` and shared by every worker thread. The
/// open count and the limits are atomics; the per-address table is behind a mutex that is
/// taken only at accept and close. The episode counters are atomics too.
final class ConnectionLimits: Sendable {
    /// An IPv4 or IPv6 address (IPv4 as `::ffff:a.b.c.d`), the per-client table's key.
    struct ClientKey: Hashable, Sendable {
        let high: UInt64
        let low: UInt64

        init?(_ sa: UnsafePointer<sockaddr>) {
            guard
                let key = SocketAddress.withAddressBytes(
                    sa,
                    { bytes -> ClientKey in
                        var b = [UInt8](repeating: 0, count: 16)
                        if bytes.count == 4 {
                            b[10] = 0xff
                            b[11] = 0xff
                            for i in 0..<4 { b[12 + i] = bytes[i] }
                        } else {
                            for i in 0..<16 { b[i] = bytes[i] }
                        }
                        return ClientKey(b)
                    })
            else { return nil }
            self = key
        }

        private init(_ b: [UInt8]) {
            high = b[0..<8].reduce(0) { $0 << 8 | UInt64($1) }
            low = b[8..<16].reduce(0) { $0 << 8 | UInt64($1) }
        }
    }

    private struct Entry {
        var open = 0
        /// Connections refused since this address last got one in (its episode).
        var refused = 0
    }

    /// Kept free for what is not a client connection: listeners, log files, the admin
    /// listener, libcurl's resolver, configuration and certificate files.
    static let reservedDescriptors = 64

    /// `max_connections: auto`: (the soft open-file limit − `reservedDescriptors`) / 2, since a
    /// client connection may hold one upstream socket as well; at least 1. 65536 open files
    /// (the systemd unit's `LimitNOFILE`) give 32736.
    static func automaticMaximum() -> Int {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 1024 }
        // RLIM_INFINITY is all ones; anything above 2^24 is treated as 2^24.
        let soft = Int(min(UInt64(limit.rlim_cur), 1 << 24))
        return max(1, (soft - reservedDescriptors) / 2)
    }

    static func effectiveMaximum(_ limits: ServerConfiguration.Limits) -> Int {
        limits.maxConnections ?? automaticMaximum()
    }

    private let maximum: Atomic<Int>
    /// 0: unlimited.
    private let perClient: Atomic<Int>
    /// Client connections admitted and not yet closed, every worker together.
    let open = Atomic<Int>(0)
    /// Connections refused by `max_connections` in the current episode (0: none going on).
    private let refusedTotal = Atomic<Int>(0)
    private let clients = Mutex<[ClientKey: Entry]>([:])

    init(_ limits: ServerConfiguration.Limits) {
        maximum = Atomic(Self.effectiveMaximum(limits))
        perClient = Atomic(limits.maxConnectionsPerClient ?? 0)
    }

    /// New limits (a reload); connections already open are not closed.
    func update(_ limits: ServerConfiguration.Limits) {
        maximum.store(Self.effectiveMaximum(limits), ordering: .relaxed)
        perClient.store(limits.maxConnectionsPerClient ?? 0, ordering: .relaxed)
    }

    var maximumNow: Int { maximum.load(ordering: .relaxed) }

    /// Counts a new connection from `key` in, or answers which limit refuses it (nothing is
    /// counted then). `describe` names the client in the log line that starts an episode.
    func admit(_ key: ClientKey?, describe: () -> String) -> ProxyError? {
        let max = maximum.load(ordering: .relaxed)
        if open.wrappingAdd(1, ordering: .relaxed).newValue > max {
            open.wrappingSubtract(1, ordering: .relaxed)
            if refusedTotal.wrappingAdd(1, ordering: .relaxed).newValue == 1 {
                Log.warning("refusing new client connections with 503: \(max) are open (limits.max_connections)")
            }
            SluiceMetrics.shared.recordRefusal(.maxConnections)
            return .tooManyConnections(limit: max)
        }
        if refusedTotal.load(ordering: .relaxed) > 0 {
            let refused = refusedTotal.exchange(0, ordering: .relaxed)
            if refused > 0 {
                Log.info(
                    "accepting client connections again: \(refused) refused while limits.max_connections (\(max)) was reached")
            }
        }
        guard let key else { return nil }
        let limit = perClient.load(ordering: .relaxed)
        // (refused now, refused in the episode that just ended)
        let (refusedNow, ended) = clients.withLock { table -> (Int, Int) in
            var entry = table[key, default: Entry()]
            if limit > 0 && entry.open >= limit {
                entry.refused += 1
                table[key] = entry
                return (entry.refused, 0)
            }
            let ended = entry.refused
            entry.open += 1
            entry.refused = 0
            table[key] = entry
            return (0, ended)
        }
        if refusedNow > 0 {
            open.wrappingSubtract(1, ordering: .relaxed)
            if refusedNow == 1 {
                Log.warning(
                    "refusing new connections from \(describe()) with 503: \(limit) are open (limits.max_connections_per_client)")
            }
            SluiceMetrics.shared.recordRefusal(.maxConnectionsPerClient)
            return .tooManyConnectionsFromClient(limit: limit)
        }
        if ended > 0 {
            Log.info("accepting connections from \(describe()) again: \(ended) refused by limits.max_connections_per_client")
        }
        return nil
    }

    /// A connection `admit` counted in has closed.
    func release(_ key: ClientKey?) {
        open.wrappingSubtract(1, ordering: .relaxed)
        guard let key else { return }
        let ended = clients.withLock { table -> Int in
            guard var entry = table[key] else { return 0 }
            entry.open -= 1
            if entry.open <= 0 {
                table.removeValue(forKey: key)
                return entry.refused
            }
            table[key] = entry
            return 0
        }
        if ended > 0 {
            Log.info("the last connection of a client refused by limits.max_connections_per_client closed (\(ended) refused)")
        }
    }

    /// Addresses with connections open: the table's size.
    var trackedClients: Int { clients.withLock { $0.count } }
}

extension Worker {
    /// Answers a connection beyond `ConnectionLimits` with a pre-written 503 and closes it,
    /// without reading its request: what has already arrived is read and dropped first, so the
    /// close sends a FIN, not a reset that could destroy the answer before the client reads it.
    func refuse(fd: Int32, _ error: ProxyError) {
        _ = recv(fd, readSpill.baseAddress, readSpill.count, Int32(MSG_DONTWAIT))
        let bytes = ResponseEncoder.errorBytes(error, close: true)
        _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }  // SIGPIPE is ignored process-wide
        shutdown(fd, Int32(SHUT_WR))
        Glibc.close(fd)
        dashboardShard.recordRefusal(error.kind)
        SluiceMetrics.shared.recordOwnResponse(error.kind)
    }
}

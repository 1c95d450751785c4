/// The native keep-alive pool's rules as a value: which idle connection a try gets, when a
/// try may open a connection under `upstream.max_connections_per_host`, who waits and who
/// goes on when a connection is freed. Events in, actions out; no sockets, no timers — the
/// `NativeUpstreamPool` performs what it answers (park, close, wake), and the rules are
/// unit-tested without a network (`Tests/SluiceServerTests/UpstreamPoolStateTests.swift`).
///
/// Connections are kept per key (an origin and the address connected to) and
/// handed out most recently used first, so a burst's connections are reused while older
/// ones age out. The limit counts per origin: every connection that is open or being opened
/// (idle ones included) holds a place until it is closed.
///
/// A burst leaves as many connections idle as it had requests in flight (a thousand clients
/// at once: a thousand origin connections, each with its socket, buffers and parser). The
/// ones nobody needed for a whole purge period are surplus: `purgeCandidates()` names half
/// of the fewest that were idle at once during the period (`idleLow`), oldest first, so a
/// burst's surplus halves every period while a pool in steady use keeps what it uses (as
/// haproxy's `pool-purge-delay` does). One idle connection is never surplus.
///
/// Threading: a value owned by one worker's pool, on that worker's thread.
struct UpstreamPoolState<Key: Hashable, Origin: Hashable, Connection: AnyObject, Waiter: AnyObject> {
    /// Connections per origin at most; 0 = no limit.
    let maxPerOrigin: Int
    /// Idle connections kept at most, all keys together.
    let maxIdle: Int
    private var idle: [Key: [Connection]] = [:]
    private(set) var idleCount = 0
    /// The fewest connections idle at once since the last `purgeCandidates()`.
    private(set) var idleLow = 0
    /// Places taken per origin (only counted with a limit).
    private var open: [Origin: Int] = [:]
    private var waiting: [Origin: [Waiter]] = [:]
    /// The key looked up last and its entry in `idle` (a worker's tries mostly go to one
    /// origin, and a request looks its key up twice: acquire and release). Hashing the key
    /// and probing cost some 400 instructions a lookup; comparing it with the last one, a
    /// tenth of that. The index holds while no key is added to or removed from `idle`:
    /// every place that does so forgets it (`forgetRecent`).
    private var recentKey: Key? = nil
    private var recentIndex: Dictionary<Key, [Connection]>.Index? = nil

    init(maxPerOrigin: Int, maxIdle: Int) {
        self.maxPerOrigin = maxPerOrigin
        self.maxIdle = maxIdle
    }

    /// What a try gets.
    enum Grant {
        /// This idle connection, now the try's.
        case reuse(Connection)
        /// The right to open a connection (its place is taken).
        case open
        /// At the limit: queued, to be woken by a later `release` or `closedIdle`.
        case wait
    }

    /// A waiter to tell to go on: `opening` with a place taken for a new connection, else to
    /// ask again (a connection just went idle for it).
    struct Wake {
        let waiter: Waiter
        let opening: Bool
    }

    mutating func acquire(origin: Origin, key: Key, for waiter: Waiter) -> Grant {
        // In place (`values[index]`): taking the list out and storing it back copied it, and
        // dropping an emptied entry made the next release allocate a new one — two
        // allocations per request on a kept-alive origin. Emptied entries stay until
        // `pruneEmpty` finds too many.
        if let index = index(of: key), let connection = idle.values[index].popLast() {
            idleCount -= 1
            idleLow = min(idleLow, idleCount)
            return .reuse(connection)
        }
        guard maxPerOrigin > 0 else { return .open }
        let taken = open[origin, default: 0]
        if taken < maxPerOrigin {
            open[origin] = taken + 1
            return .open
        }
        waiting[origin, default: []].append(waiter)
        return .wait
    }

    /// A queued waiter gave up.
    mutating func cancelWait(origin: Origin, for waiter: Waiter) {
        guard var list = waiting[origin], let i = list.firstIndex(where: { $0 === waiter }) else { return }
        list.remove(at: i)
        waiting[origin] = list.isEmpty ? nil : list
    }

    /// What to do with a connection a try is done with.
    enum Release {
        /// Keep it idle (it is in the pool now).
        case park
        /// Close it.
        case close
    }

    /// A try is done with `connection` (nil: the place it was granted for a connection that
    /// never opened). The connection is parked when `reusable` and there is room, else
    /// closed; a waiter for the origin may go on either way.
    mutating func release(
        _ connection: Connection?, key: Key, origin: Origin,
        reusable: Bool
    ) -> (Release, Wake?) {
        if let connection, reusable, idleCount < maxIdle {
            if let index = index(of: key) {
                idle.values[index].append(connection)
            } else {
                idle[key] = [connection]
                forgetRecent()
            }
            idleCount += 1
            pruneEmpty()
            return (.park, wake(origin: origin, freedPlace: false))
        }
        return (.close, wake(origin: origin, freedPlace: true))
    }

    /// An idle connection went bad (the origin closed it, sent bytes unasked, or it aged
    /// out): it leaves the pool, and its place may go to a waiter. False if it was not idle.
    mutating func closedIdle(_ connection: Connection, key: Key, origin: Origin) -> (removed: Bool, wake: Wake?) {
        guard let index = index(of: key), let i = idle.values[index].firstIndex(where: { $0 === connection })
        else { return (false, nil) }
        idle.values[index].remove(at: i)
        idleCount -= 1
        idleLow = min(idleLow, idleCount)
        pruneEmpty()
        return (true, wake(origin: origin, freedPlace: true))
    }

    /// The surplus of the period that ends now: half (rounded down) of the fewest
    /// connections that were idle at once since the last call, taken from every key in
    /// proportion to its idle connections (at least one from a key while the surplus lasts),
    /// oldest first. They stay in the pool: the caller closes each through `closedIdle`
    /// (which frees its place). The next period starts with what is idle after that.
    mutating func purgeCandidates() -> [Connection] {
        let surplus = idleLow / 2
        var out: [Connection] = []
        if surplus > 0 {
            out.reserveCapacity(surplus)
            for list in idle.values where !list.isEmpty && out.count < surplus {
                let share = max(1, list.count * surplus / idleCount)
                out.append(contentsOf: list.prefix(min(share, surplus - out.count)))
            }
        }
        idleLow = idleCount - out.count
        return out
    }

    /// Keys whose lists are empty, when they outnumber the idle connections (plus some
    /// slack) — a proxy that talked to many origins once keeps no entry for each.
    private mutating func pruneEmpty() {
        guard idle.count > 2 * idleCount + 64 else { return }
        idle = idle.filter { !$0.value.isEmpty }
        forgetRecent()
    }

    /// `key`'s entry in `idle`, from the memo when it is the key looked up last.
    private mutating func index(of key: Key) -> Dictionary<Key, [Connection]>.Index? {
        if let recentIndex, let recentKey, recentKey == key { return recentIndex }
        guard let index = idle.index(forKey: key) else { return nil }
        recentKey = key
        recentIndex = index
        return index
    }

    /// Keys were added to or removed from `idle`: the memo's index may name another entry.
    private mutating func forgetRecent() {
        recentKey = nil
        recentIndex = nil
    }

    /// Keys held (for tests): at most twice the idle connections, plus 64.
    var keyCount: Int { idle.count }

    /// Every idle connection, left in the pool.
    var idleConnections: [Connection] { idle.values.flatMap { $0 } }

    /// Every idle connection, emptying the pool (shutdown).
    mutating func drainIdle() -> [Connection] {
        let all = idle.values.flatMap { $0 }
        idle.removeAll()
        forgetRecent()
        idleCount = 0
        idleLow = 0
        waiting.removeAll()
        return all
    }

    /// Waiters queued for `origin` (for tests and reports).
    func waiters(for origin: Origin) -> Int { waiting[origin]?.count ?? 0 }

    /// Places taken for `origin` under the limit (for tests and reports).
    func places(for origin: Origin) -> Int { open[origin] ?? 0 }

    private mutating func wake(origin: Origin, freedPlace: Bool) -> Wake? {
        guard maxPerOrigin > 0 else { return nil }
        if freedPlace {
            let taken = open[origin, default: 1] - 1
            open[origin] = taken > 0 ? taken : nil
        }
        guard var list = waiting[origin], !list.isEmpty else { return nil }
        let next = list.removeFirst()
        waiting[origin] = list.isEmpty ? nil : list
        if freedPlace { open[origin, default: 0] += 1 }
        return Wake(waiter: next, opening: freedPlace)
    }
}

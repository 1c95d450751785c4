import Synchronization

/// One `rate_limit` limit (docs/configuration.md, "Rate limits"): `requests` per
/// `periodMilliseconds` (`rate: 100/s`, `6000/min`, `5000/h`), of which `burst` may go at once
/// after a quiet spell.
public struct RateLimit: Sendable, Hashable, CustomStringConvertible {
    public var requests: Int
    public var periodMilliseconds: Int
    public var burst: Int

    public init(requests: Int, periodMilliseconds: Int, burst: Int = 1) {
        precondition(requests > 0 && periodMilliseconds > 0 && burst > 0)
        self.requests = requests
        self.periodMilliseconds = periodMilliseconds
        self.burst = burst
    }

    /// The emission interval: the time one request uses up, in microseconds.
    public var interval: Int64 { Int64(periodMilliseconds) * 1000 / Int64(requests) }
    /// How far the schedule may run ahead of the clock before a request waits: `burst - 1`
    /// intervals (GCRA's tolerance).
    public var tolerance: Int64 { interval * Int64(burst - 1) }

    /// As written in the configuration: `100/s`, `6000/min`, `5000/h`, or `N/Xms`.
    public var description: String {
        switch periodMilliseconds {
        case 1000: return "\(requests)/s"
        case 60_000: return "\(requests)/min"
        case 3_600_000: return "\(requests)/h"
        default: return "\(requests)/\(periodMilliseconds)ms"
        }
    }
}

/// The generic cell rate algorithm for one limit and one key: the whole state is the key's
/// theoretical arrival time (TAT), the time by which every request admitted so far would have
/// gone at exactly the limit's rate. A request arriving at `now` conforms once
/// `now >= TAT - tolerance`; otherwise it may go at `TAT - tolerance`, and the wait until then
/// is exact. Pure functions on that one number, so that the state can live anywhere (a
/// worker's table, or a shared store).
public enum GCRA {
    /// When a request arriving at `now` (µs) may go under `limit`, given the key's TAT (nil:
    /// none yet): the delay from `now` (µs, 0: at once).
    public static func delay(tat: Int64?, now: Int64, limit: RateLimit) -> Int64 {
        guard let tat else { return 0 }
        return max(0, tat - limit.tolerance - now)
    }

    /// The key's TAT after a request goes at `at` (µs).
    public static func next(tat: Int64?, at: Int64, limit: RateLimit) -> Int64 {
        max(tat ?? at, at) + limit.interval
    }
}

/// Several limits (`rate: 10/s` and `rate: 5000/h` together) over many keys: one TAT per key
/// and limit, at most `capacity` keys (the least recently used is forgotten first, and
/// counted). A request is given the longest of its limits' delays; it goes — and takes its
/// place in every limit — only when that delay is within `maxWait`. Requests of one key are
/// served first come, first served: each takes the next place in the schedule.
///
/// Threading: a value; its owner serializes access (one table per process, under a lock).
public struct RateLimiter: Sendable {
    public enum Decision: Equatable, Sendable {
        /// Go after `delay` µs (0: now); `reservation` gives the place back if the request
        /// leaves before (`cancel`).
        case go(delay: Int64, reservation: Reservation)
        /// Over the limit for longer than the request may wait: the earliest a request of this
        /// key could go, in µs from now, and which of the limits holds it back (an index into
        /// `limits`).
        case refuse(retryAfter: Int64, limit: Int)
    }

    /// A place taken in the schedule of `key`: its TATs before (nil: the key was new) and after.
    public struct Reservation: Equatable, Sendable {
        public let key: String
        let before: [Int64]?
        let after: [Int64]
    }

    public let limits: [RateLimit]
    public let capacity: Int
    private var tats: [String: [Int64]] = [:]
    private var order = LRUOrder<String>()
    /// Keys forgotten to stay within `capacity` while their schedule was still ahead of the
    /// clock (a burst they may take again).
    public private(set) var evictedBusy = 0
    public private(set) var evicted = 0

    public init(limits: [RateLimit], capacity: Int = 10_000) {
        precondition(!limits.isEmpty && capacity > 0)
        self.limits = limits
        self.capacity = capacity
    }

    public var keyCount: Int { tats.count }

    /// Decides for a request of `key` arriving at `now` (µs) that may wait up to `maxWait` µs.
    public mutating func acquire(_ key: String, now: Int64, maxWait: Int64) -> Decision {
        let current = tats[key]
        var delay: Int64 = 0
        var binding = 0
        for (i, limit) in limits.enumerated() {
            let d = GCRA.delay(tat: current?[i], now: now, limit: limit)
            if d > delay { (delay, binding) = (d, i) }
        }
        guard delay <= maxWait else { return .refuse(retryAfter: delay, limit: binding) }
        let at = now + delay
        var after: [Int64] = []
        after.reserveCapacity(limits.count)
        for (i, limit) in limits.enumerated() { after.append(GCRA.next(tat: current?[i], at: at, limit: limit)) }
        if current == nil { evictIfFull(now: now) }
        tats[key] = after
        order.touch(key)
        return .go(delay: delay, reservation: Reservation(key: key, before: current, after: after))
    }

    /// A request that was told to wait left before its turn: when no later request of its key
    /// took a place after it, the place is given back (otherwise the schedule keeps the gap,
    /// which only ever errs on the side of the limit).
    public mutating func cancel(_ reservation: Reservation) {
        guard tats[reservation.key] == reservation.after else { return }
        if let before = reservation.before {
            tats[reservation.key] = before
        } else {
            tats[reservation.key] = nil
            order.remove(reservation.key)
        }
    }

    private mutating func evictIfFull(now: Int64) {
        guard tats.count >= capacity, let oldest = order.oldest else { return }
        if let schedule = tats[oldest], schedule.contains(where: { $0 > now }) { evictedBusy += 1 }
        evicted += 1
        tats[oldest] = nil
        order.remove(oldest)
    }
}

/// A policy's `rate_limit` (docs/configuration.md, "Rate limits"): its limits, what a request
/// over them gets, and what it is counted by.
public struct RateLimitSettings: Sendable, Equatable {
    public enum OnLimit: String, Sendable, CaseIterable {
        /// Wait for its turn, up to `maxWait`, then 429.
        case wait
        /// 429 at once.
        case reject
    }

    /// What requests are counted by.
    public enum Key: Sendable, Equatable, CustomStringConvertible {
        /// The origin's host: every client shares the limit.
        case host
        /// The client's address.
        case client
        /// The proxy-authentication user (`access.proxy_auth`; no user: one shared key).
        case user
        /// A request field's value (absent: one shared key).
        case header(String)

        public var description: String {
            switch self {
            case .host: return "host"
            case .client: return "client"
            case .user: return "user"
            case .header(let name): return "header:\(name)"
            }
        }
    }

    /// `2 s`: how long a request may wait for its turn by default.
    public static let defaultMaxWait = 2000

    public var limits: [RateLimit]
    public var onLimit: OnLimit
    /// Milliseconds.
    public var maxWait: Int
    public var key: Key

    public init(limits: [RateLimit], onLimit: OnLimit = .wait, maxWait: Int = RateLimitSettings.defaultMaxWait, key: Key = .host)
    {
        self.limits = limits
        self.onLimit = onLimit
        self.maxWait = maxWait
        self.key = key
    }

    /// `100/s`, `6000/min`, `5000/h`: nil when `text` is none of those forms.
    public static func parseRate(_ text: String) -> (requests: Int, periodMilliseconds: Int)? {
        let parts = text.filter { $0 != " " }.split(separator: "/", maxSplits: 1).map(String.init)
        guard parts.count == 2, let n = Int(parts[0]), n > 0, n <= 1_000_000 else { return nil }
        switch parts[1] {
        case "s", "sec", "second": return (n, 1000)
        case "m", "min", "minute": return (n, 60_000)
        case "h", "hour": return (n, 3_600_000)
        default: return nil
        }
    }
}

/// Every policy's rate-limit tables, shared by every worker of the process (the limit holds
/// for the process, not per worker): one `RateLimiter` per policy and set of limits, so a
/// reload that keeps a policy's limits keeps their schedules, and one that changes them starts
/// afresh.
///
/// Threading: any worker's thread; the tables sit under one lock (a decision is a dictionary
/// lookup and a few additions).
public final class RateLimitTable: Sendable {
    /// Keys kept per table before the least recently used is forgotten.
    public static let defaultCapacity = 10_000

    /// Which table: a policy under one set of limits.
    private struct Name: Hashable {
        let policy: String
        let limits: [RateLimit]
    }

    private let tables = Mutex<[Name: RateLimiter]>([:])
    private let capacity: Int

    public init(capacity: Int = RateLimitTable.defaultCapacity) { self.capacity = capacity }

    public func acquire(
        policy: String, _ settings: RateLimitSettings, key: String, now: Int64, maxWait: Int64
    ) -> RateLimiter.Decision {
        let name = Name(policy: policy, limits: settings.limits)
        return tables.withLock { tables in
            tables[name, default: RateLimiter(limits: settings.limits, capacity: capacity)]
                .acquire(key, now: now, maxWait: maxWait)
        }
    }

    public func cancel(policy: String, _ settings: RateLimitSettings, _ reservation: RateLimiter.Reservation) {
        tables.withLock { tables in tables[Name(policy: policy, limits: settings.limits)]?.cancel(reservation) }
    }
}

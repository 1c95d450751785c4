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
/// counted). A request is given the longest of its limits' delays — and no earlier than
/// `notBefore`, a hold the origin asked for (`RateLimitLearning`); it goes — and takes its
/// place in every limit — only when that delay is within `maxWait`. Requests of one key are
/// served first come, first served: each takes the next place in the schedule.
///
/// Threading: a value; its owner serializes access (one table per process, under a lock).
public struct RateLimiter: Sendable {
    public enum Decision: Equatable, Sendable {
        /// Go after `delay` µs (0: now); `reservation` gives the place back if the request
        /// leaves before (`cancel`; nil: no schedule was touched).
        case go(delay: Int64, reservation: Reservation?)
        /// Over the limit for longer than the request may wait: the earliest a request of this
        /// key could go, in µs from now, and which of the limits holds it back (an index into
        /// `limits`; nil: the origin's hold).
        case refuse(retryAfter: Int64, limit: Int?)
    }

    /// A place taken in the schedule of `key`: its TATs before (nil: the key was new) and after.
    public struct Reservation: Equatable, Sendable {
        public let key: String
        let before: [Int64]?
        let after: [Int64]
    }

    public let limits: [RateLimit]
    public let capacity: Int
    /// Which keys have a schedule, least recently used first; each key's slot there indexes
    /// `schedules` (so a request costs one hash lookup).
    private var order = LRUOrder<String>()
    /// The TATs per limit of the key in each slot (empty: a free slot).
    private var schedules: [[Int64]] = []
    /// Keys forgotten to stay within `capacity` while their schedule was still ahead of the
    /// clock (a burst they may take again).
    public private(set) var evictedBusy = 0
    public private(set) var evicted = 0
    /// Requests that went at once (counted here: the table's lock is held already).
    public private(set) var allowed = 0

    public init(limits: [RateLimit], capacity: Int = 10_000) {
        precondition(!limits.isEmpty && capacity > 0)
        self.limits = limits
        self.capacity = capacity
    }

    public var keyCount: Int { order.count }

    /// Decides for a request of `key` arriving at `now` (µs) that may wait up to `maxWait` µs
    /// and may not go before `notBefore` (µs; the origin's hold). (The key's schedule is read
    /// and written in place; a request that goes at once gets no reservation.)
    public mutating func acquire(_ key: String, now: Int64, maxWait: Int64, notBefore: Int64 = 0) -> Decision {
        var decision = Decision.go(delay: 0, reservation: nil)
        if let s = order.slot(of: key) {
            Self.decide(&schedules[s], fresh: false, key, limits, now: now, maxWait: maxWait, notBefore: notBefore, &decision)
            guard case .go(let delay, _) = decision else { return decision }
            order.touch(slot: s)
            if delay == 0 { allowed += 1 }
            return decision
        }
        var schedule: [Int64] = []
        Self.decide(&schedule, fresh: true, key, limits, now: now, maxWait: maxWait, notBefore: notBefore, &decision)
        guard case .go(let delay, _) = decision else { return decision }
        let s = order.touch(key)
        if s == schedules.count { schedules.append(schedule) } else { schedules[s] = schedule }
        if order.count > capacity, let oldest = order.oldest, let old = order.slot(of: oldest) {
            if schedules[old].contains(where: { $0 > now }) { evictedBusy += 1 }
            evicted += 1
            order.remove(oldest)
            schedules[old] = []
        }
        if delay == 0 { allowed += 1 }
        return decision
    }

    private static func decide(
        _ schedule: inout [Int64], fresh: Bool, _ key: String, _ limits: [RateLimit], now: Int64, maxWait: Int64,
        notBefore: Int64, _ decision: inout Decision
    ) {
        var delay: Int64 = 0
        var binding: Int? = nil
        for i in limits.indices {
            let d = GCRA.delay(tat: fresh ? nil : schedule[i], now: now, limit: limits[i])
            if d > delay { (delay, binding) = (d, i) }
        }
        if notBefore - now > delay { (delay, binding) = (notBefore - now, nil) }
        guard delay <= maxWait else {
            decision = .refuse(retryAfter: delay, limit: binding)
            return
        }
        let at = now + delay
        // Kept only for a reservation (a copy makes the update below copy the array).
        let before: [Int64]? = delay > 0 && !fresh ? schedule : nil
        if fresh { schedule = Array(repeating: 0, count: limits.count) }
        for i in limits.indices {
            schedule[i] = GCRA.next(tat: fresh ? nil : schedule[i], at: at, limit: limits[i])
        }
        if delay > 0 { decision = .go(delay: delay, reservation: Reservation(key: key, before: before, after: schedule)) }
    }

    /// A request that was told to wait left before its turn: when no later request of its key
    /// took a place after it, the place is given back (otherwise the schedule keeps the gap,
    /// which only ever errs on the side of the limit).
    public mutating func cancel(_ reservation: Reservation) {
        guard let s = order.slot(of: reservation.key), schedules[s] == reservation.after else { return }
        if let before = reservation.before {
            schedules[s] = before
        } else {
            order.remove(reservation.key)
            schedules[s] = []
        }
    }
}

/// `rate_limit.max_concurrent` for many keys: how many requests of each key are in flight,
/// and the tickets of those waiting for one of them to end, first come, first served. A key
/// with none in flight and none waiting is forgotten, so the table holds only busy keys.
///
/// Threading: a value; its owner serializes access.
public struct ConcurrencyLimiter: Sendable {
    public struct Line: Sendable {
        var inFlight = 0
        var waiting: [UInt64] = []
        var head = 0
        var isEmpty: Bool { inFlight == 0 && head == waiting.count }
    }
    private var lines: [String: Line] = [:]

    public init() {}

    /// Keys with requests in flight or waiting.
    public var keyCount: Int { lines.count }
    public var keys: Dictionary<String, Line>.Keys { lines.keys }

    public func inFlight(_ key: String) -> Int { lines[key]?.inFlight ?? 0 }
    /// Requests in flight over every key that starts with `prefix`.
    public func inFlight(prefix: String) -> Int {
        lines.reduce(0) { $0 + ($1.key.hasPrefix(prefix) ? $1.value.inFlight : 0) }
    }
    public func waiting(_ key: String) -> Int { lines[key].map { $0.waiting.count - $0.head } ?? 0 }

    /// A request of `key` asks for one of `limit` places: true, it holds one now; false, it
    /// waits as `ticket` (when `queue`; otherwise nothing is recorded).
    public mutating func acquire(_ key: String, limit: Int, ticket: UInt64, queue: Bool) -> Bool {
        var line = lines[key, default: Line()]
        if line.inFlight < limit && line.head == line.waiting.count {
            line.inFlight += 1
            lines[key] = line
            return true
        }
        guard queue else { return false }
        line.waiting.append(ticket)
        lines[key] = line
        return false
    }

    /// A request of `key` that held a place ended: the places free under `limit` go to the
    /// longest-waiting tickets, which now hold them (their owners must be told; one that
    /// cannot be gives its place back with another `release`).
    public mutating func release(_ key: String, limit: Int) -> [UInt64] {
        guard var line = lines[key] else { return [] }
        line.inFlight = max(0, line.inFlight - 1)
        var granted: [UInt64] = []
        while line.inFlight < limit && line.head < line.waiting.count {
            granted.append(line.waiting[line.head])
            line.head += 1
            line.inFlight += 1
        }
        if line.head > 64 && line.head * 2 > line.waiting.count {
            line.waiting.removeFirst(line.head)
            line.head = 0
        }
        lines[key] = line.isEmpty ? nil : line
        return granted
    }

    /// A waiting ticket leaves: true when it was still waiting; false when it holds a place
    /// already (a `release` granted it; its owner now holds that place and must release it).
    public mutating func leave(_ key: String, ticket: UInt64) -> Bool {
        guard var line = lines[key], let i = line.waiting[line.head...].firstIndex(of: ticket) else { return false }
        line.waiting.remove(at: i)
        lines[key] = line.isEmpty ? nil : line
        return true
    }
}

/// What an origin's answer says about its own rate limit (`rate_limit.learn`): until when it
/// wants no more requests of this key. Read from `Retry-After` on a 429 or 503, from the IETF
/// httpapi draft's `RateLimit` field (`"policy";r=0;t=5`, or the earlier `remaining=0,
/// reset=5`) and its `RateLimit-Remaining` / `RateLimit-Reset`, and from the common
/// `X-RateLimit-Remaining` / `X-RateLimit-Reset` (delta seconds, or Unix seconds as GitHub
/// sends) and `X-RateLimit-Reset-After`. A quota with requests left (`remaining` above 0) holds
/// nothing; waits above a day are not believed.
public enum RateLimitLearning {
    /// A hold the origin asked for: `milliseconds` from now, and where it was read.
    public struct Hold: Equatable, Sendable {
        public var milliseconds: Int
        public var reason: String
    }

    /// The fields read (lower-case names), for a caller that keeps only those.
    public static let fieldNames = [
        "retry-after", "ratelimit", "ratelimit-remaining", "ratelimit-reset", "x-ratelimit-remaining",
        "x-ratelimit-reset", "x-ratelimit-reset-after",
    ]

    /// The longest hold `status` and the fields (`value(name)`: a lower-case name's value)
    /// ask for; `wallClockNow`: ms since the Unix epoch (for dates and Unix-time resets).
    public static func hold(status: Int, wallClockNow: Int, _ value: (String) -> String?) -> Hold? {
        var best: Hold?
        func consider(_ ms: Int?, _ reason: @autoclosure () -> String) {
            guard let ms, ms > 0, ms <= RetryAfter.maxDelaySeconds * 1000 else { return }
            if ms > best?.milliseconds ?? 0 { best = Hold(milliseconds: ms, reason: reason()) }
        }
        if status == 429 || status == 503, let text = value("retry-after"), let after = RetryAfter(text) {
            consider(after.milliseconds(wallClockNow: wallClockNow), "\(status) with Retry-After: \(text)")
        }
        if let text = value("ratelimit") {
            consider(rateLimitField(text), "RateLimit: \(text)")
        }
        if let remaining = value("ratelimit-remaining"), number(remaining) == 0, let reset = value("ratelimit-reset") {
            consider(number(reset).map { $0 * 1000 }, "RateLimit-Remaining: 0, RateLimit-Reset: \(reset)")
        }
        if let remaining = value("x-ratelimit-remaining"), number(remaining) == 0 {
            if let reset = value("x-ratelimit-reset"), let n = number(reset) {
                // GitHub and others send the Unix time of the reset (a few send it in ms); most
                // send seconds from now.
                let ms = n > 100_000_000_000 ? n - wallClockNow : n > 1_000_000_000 ? n * 1000 - wallClockNow : n * 1000
                consider(ms, "X-RateLimit-Remaining: 0, X-RateLimit-Reset: \(reset)")
            }
            if let after = value("x-ratelimit-reset-after"), let seconds = Double(after.trimmingSpaces), seconds >= 0,
                seconds <= Double(RetryAfter.maxDelaySeconds)
            {
                consider(Int((seconds * 1000).rounded(.up)), "X-RateLimit-Remaining: 0, X-RateLimit-Reset-After: \(after)")
            }
        }
        return best
    }

    /// `RateLimit`: the draft's list of `"policy";r=N;t=S` items (the longest `t` of those
    /// with `r=0`), or the earlier dictionary `limit=N, remaining=N, reset=S`.
    static func rateLimitField(_ text: String) -> Int? {
        var longest: Int?
        var remaining: Int?
        var reset: Int?
        for item in text.split(separator: ",") {
            var r: Int?
            var t: Int?
            for part in item.split(separator: ";") {
                let pair = part.split(separator: "=", maxSplits: 1)
                guard pair.count == 2 else { continue }
                let name = pair[0].trimmingSpaces.lowercased()
                let n = number(String(pair[1]))
                switch name {
                case "r": r = n
                case "t": t = n
                case "remaining": remaining = n
                case "reset": reset = n
                default: break
                }
            }
            if r == 0, let t { longest = max(longest ?? 0, t * 1000) }
        }
        if remaining == 0, let reset { longest = max(longest ?? 0, reset * 1000) }
        return longest
    }

    private static func number(_ text: String) -> Int? {
        let t = text.trimmingSpaces
        guard !t.isEmpty, t.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), t.utf8.count <= 13 else { return nil }
        return Int(t)
    }
}

extension StringProtocol {
    fileprivate var trimmingSpaces: String {
        var s = Substring(self)
        while let c = s.first, c == " " || c == "\t" || c == "\"" { s = s.dropFirst() }
        while let c = s.last, c == " " || c == "\t" || c == "\"" { s = s.dropLast() }
        return String(s)
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

    /// May be empty: a policy that only learns, or only caps concurrency.
    public var limits: [RateLimit]
    public var onLimit: OnLimit
    /// Milliseconds.
    public var maxWait: Int
    public var key: Key
    /// Hold requests when the origin says its own limit is reached (`RateLimitLearning`).
    public var learn: Bool
    /// At most this many tries of one key upstream at once (`max_concurrent`); nil: no cap.
    public var maxConcurrent: Int?
    /// Where the rates and the holds are kept when a `fleet:` is configured.
    public var scope = Scope.fleet

    public enum Scope: String, Sendable, CaseIterable {
        /// In the fleet's Redis: the limits hold for every instance together.
        case fleet
        /// In this process only.
        case local
    }

    public init(
        limits: [RateLimit], onLimit: OnLimit = .wait, maxWait: Int = RateLimitSettings.defaultMaxWait,
        key: Key = .host, learn: Bool = true, maxConcurrent: Int? = nil
    ) {
        self.limits = limits
        self.onLimit = onLimit
        self.maxWait = maxWait
        self.key = key
        self.learn = learn
        self.maxConcurrent = maxConcurrent
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

/// A policy's `rate_limit` as its tries read it: the policy's name with its settings, in one
/// immutable object (`HostPolicy.rateLimiting`).
public final class RateLimiting: Sendable {
    public let policy: String
    public let settings: RateLimitSettings
    public init(policy: String, settings: RateLimitSettings) {
        self.policy = policy
        self.settings = settings
    }
}

/// Every policy's rate-limit state, shared by every worker of the process (the limits hold
/// for the process, not per worker): one `RateLimiter` per policy and set of limits, so a
/// reload that keeps a policy's limits keeps their schedules, and one that changes them starts
/// afresh (tries already waiting keep their turn); the holds the origins asked for, and the
/// requests in flight and waiting under `max_concurrent`, per policy and key (they survive a
/// reload that changes the limits). Waiters under `max_concurrent` are woken through the
/// `wake` function they gave: it hands the ticket to their worker's loop, and a worker that
/// is gone (false) passes the place on.
///
/// Threading: any worker's thread; the state sits under one lock (a decision is a few
/// dictionary lookups and additions); `wake` functions are called after it is released.
public final class RateLimitTable: Sendable {
    /// Keys kept per table before the least recently used is forgotten.
    public static let defaultCapacity = 10_000

    /// A key of a policy (holds and concurrency).
    private struct PolicyKey: Hashable {
        let policy: String
        let key: String
    }

    /// A hold the origin asked for: until when (monotonic µs), why, and when it was learned.
    public struct Hold: Sendable, Equatable {
        public let until: Int64
        public let reason: String
        public let learnedAt: Int64
    }

    /// A concurrency waiter: its key and how to wake it.
    private struct Waiter {
        let key: PolicyKey
        let limit: Int
        let wake: @Sendable (UInt64) -> Bool
    }

    private struct State {
        /// Each policy's schedules, one per set of limits it had: the current one first is
        /// the usual case; a reload that changed the limits adds one (the requests of the
        /// old configuration still finishing use the old), and only the two latest are kept.
        var tables: [String: [RateLimiter]] = [:]
        var holds: [PolicyKey: Hold] = [:]
        var concurrency = ConcurrencyLimiter()
        var waiters: [UInt64: Waiter] = [:]
        var nextTicket: UInt64 = 0
        /// Tries waiting for their turn (a timer or a concurrency place), per policy.
        var waiting: [String: Int] = [:]
        /// What happened, per policy (a policy's tables count its `allowed` tries).
        var counts: [String: Counts] = [:]
        /// Keys the fleet refused, until when (µs) and by which limit (nil: a hold): tries of
        /// the key are refused without a round trip until then.
        var fleetDenials: [PolicyKey: (until: Int64, limit: Int?)] = [:]
    }

    private let state = Mutex(State())
    public let capacity: Int

    public init(capacity: Int = RateLimitTable.defaultCapacity) { self.capacity = max(1, capacity) }

    /// Decides for a try of `key` under `settings`' limits and the origin's hold (see
    /// `RateLimiter.acquire`).
    public func acquire(
        policy: String, _ settings: RateLimitSettings, key: String, now: Int64, maxWait: Int64
    ) -> RateLimiter.Decision {
        state.withLock { state in
            var notBefore: Int64 = 0
            if settings.learn, !state.holds.isEmpty, let hold = state.holds[PolicyKey(policy: policy, key: key)] {
                if hold.until > now { notBefore = hold.until } else { state.holds[PolicyKey(policy: policy, key: key)] = nil }
            }
            guard !settings.limits.isEmpty else {
                let delay = max(0, notBefore - now)
                if delay == 0 { state.counts[policy, default: Counts()].allowed += 1 }
                return delay <= maxWait ? .go(delay: delay, reservation: nil) : .refuse(retryAfter: delay, limit: nil)
            }
            var dropped: RateLimiter?
            let decision = Self.acquire(
                in: &state.tables[policy, default: []], settings.limits, capacity: capacity, key: key, now: now,
                maxWait: maxWait, notBefore: notBefore, dropped: &dropped)
            if let dropped {
                // Its counts stay in the policy's (the counters never go backwards).
                state.counts[policy, default: Counts()].allowed += dropped.allowed
                state.counts[policy, default: Counts()].evicted += dropped.evicted
            }
            return decision
        }
    }

    /// Decides in the policy's schedule for `limits` (made when missing; the two latest kept).
    private static func acquire(
        in list: inout [RateLimiter], _ limits: [RateLimit], capacity: Int, key: String, now: Int64, maxWait: Int64,
        notBefore: Int64, dropped: inout RateLimiter?
    ) -> RateLimiter.Decision {
        if list.isEmpty || list[0].limits != limits {
            if let i = list.firstIndex(where: { $0.limits == limits }) {
                list.swapAt(0, i)
            } else {
                list.insert(RateLimiter(limits: limits, capacity: capacity), at: 0)
                if list.count > 2 { dropped = list.popLast() }
            }
        }
        return list[0].acquire(key, now: now, maxWait: maxWait, notBefore: notBefore)
    }

    public func cancel(policy: String, _ settings: RateLimitSettings, _ reservation: RateLimiter.Reservation?) {
        guard let reservation else { return }
        state.withLock { state in
            guard let i = state.tables[policy]?.firstIndex(where: { $0.limits == settings.limits }) else { return }
            state.tables[policy]![i].cancel(reservation)
        }
    }

    /// How long (µs from `now`) the origin's hold on `key` still lasts (0: none).
    public func holdRemaining(policy: String, key: String, now: Int64) -> Int64 {
        state.withLock { state in
            guard let hold = state.holds[PolicyKey(policy: policy, key: key)] else { return 0 }
            return max(0, hold.until - now)
        }
    }

    /// The fleet refused a try of `key` until `until` (µs): later tries are refused without
    /// asking (bounded like the holds: ended ones are dropped first).
    public func rememberFleetDenial(policy: String, key: String, until: Int64, limit: Int?, now: Int64) {
        state.withLock { state in
            if state.fleetDenials.count >= capacity { state.fleetDenials = state.fleetDenials.filter { $0.value.until > now } }
            guard state.fleetDenials.count < capacity else { return }
            state.fleetDenials[PolicyKey(policy: policy, key: key)] = (until, limit)
        }
    }

    /// A refusal of the fleet for `key` still running at `now`.
    public func fleetDenial(policy: String, key: String, now: Int64) -> (until: Int64, limit: Int?)? {
        state.withLock { state in
            guard !state.fleetDenials.isEmpty else { return nil }
            let name = PolicyKey(policy: policy, key: key)
            guard let denial = state.fleetDenials[name] else { return nil }
            if denial.until > now { return denial }
            state.fleetDenials[name] = nil
            return nil
        }
    }

    /// Where the hold on `key` was read (nil: none).
    public func holdReason(policy: String, key: String) -> String? {
        state.withLock { state in state.holds[PolicyKey(policy: policy, key: key)]?.reason }
    }

    /// The origin asked for no requests of `key` until `now + hold` (µs): later holds win; the
    /// holds stay within `capacity` keys per process (expired ones go first, then the
    /// soonest to end).
    public func learn(policy: String, key: String, hold: RateLimitLearning.Hold, now: Int64) {
        let until = now + Int64(hold.milliseconds) * 1000
        state.withLock { state in
            let name = PolicyKey(policy: policy, key: key)
            if let existing = state.holds[name], existing.until >= until { return }
            if state.holds[name] == nil, state.holds.count >= capacity {
                state.holds = state.holds.filter { $0.value.until > now }
                if state.holds.count >= capacity, let soonest = state.holds.min(by: { $0.value.until < $1.value.until }) {
                    state.holds[soonest.key] = nil
                }
            }
            state.holds[name] = Hold(until: until, reason: hold.reason, learnedAt: now)
            state.counts[policy, default: Counts()].learned += 1
        }
    }

    /// A try of `key` asks for one of `limit` places (`max_concurrent`): `.go` (it holds
    /// one), `.wait(ticket)` (`wake(ticket)` is called when it holds one, unless it leaves
    /// first), or nil: none free and `queue` is false.
    public func acquireSlot(
        policy: String, key: String, limit: Int, queue: Bool, wake: @escaping @Sendable (UInt64) -> Bool
    ) -> SlotAnswer? {
        state.withLock { state in
            state.nextTicket += 1
            let ticket = state.nextTicket
            let name = PolicyKey(policy: policy, key: key)
            if state.concurrency.acquire(Self.slotKey(name), limit: limit, ticket: ticket, queue: queue) { return .go }
            guard queue else { return nil }
            state.waiters[ticket] = Waiter(key: name, limit: limit, wake: wake)
            return .wait(ticket)
        }
    }

    public enum SlotAnswer: Equatable, Sendable {
        case go
        case wait(UInt64)
    }

    /// A try that held a place of `key` ended: the place goes to the longest waiter.
    public func releaseSlot(policy: String, key: String, limit: Int) {
        var granted = state.withLock { state in
            Self.grant(&state, PolicyKey(policy: policy, key: key), limit: limit)
        }
        // Woken outside the lock; a waiter whose worker is gone passes its place on.
        while let (ticket, waiter) = granted.popLast() {
            if !waiter.wake(ticket) {
                granted += state.withLock { state in Self.grant(&state, waiter.key, limit: waiter.limit) }
            }
        }
    }

    private static func grant(_ state: inout State, _ name: PolicyKey, limit: Int) -> [(UInt64, Waiter)] {
        state.concurrency.release(slotKey(name), limit: limit).compactMap { ticket in
            state.waiters.removeValue(forKey: ticket).map { (ticket, $0) }
        }
    }

    /// A waiting ticket leaves (its client went, or its wait ran out): true when it was still
    /// waiting; false when it was given a place meanwhile — its owner holds it now (the wake
    /// may still arrive, and is to be ignored) and must release it.
    public func leaveSlot(policy: String, key: String, ticket: UInt64) -> Bool {
        state.withLock { state in
            let left = state.concurrency.leave(Self.slotKey(PolicyKey(policy: policy, key: key)), ticket: ticket)
            state.waiters[ticket] = nil
            return left
        }
    }

    private static func slotKey(_ name: PolicyKey) -> String { name.policy + "\u{0}" + name.key }

    /// A try began (`+1`) or stopped (`-1`) waiting for its turn under `policy`.
    public func noteWaiting(policy: String, _ delta: Int) {
        state.withLock { state in
            let n = state.waiting[policy, default: 0] + delta
            state.waiting[policy] = n > 0 ? n : nil
        }
    }

    /// What the policies' limits did (`sluice_rate_limit_*` counters): tries allowed at once,
    /// that went after waiting, refused, or whose client left while waiting; holds learned;
    /// keys evicted.
    public struct Counts: Sendable, Equatable {
        public var allowed = 0
        public var waited = 0
        public var rejected = 0
        public var left = 0
        public var learned = 0
        public var evicted = 0
        public init() {}

        public func minus(_ other: Counts) -> Counts {
            var d = Counts()
            d.allowed = max(0, allowed - other.allowed)
            d.waited = max(0, waited - other.waited)
            d.rejected = max(0, rejected - other.rejected)
            d.left = max(0, left - other.left)
            d.learned = max(0, learned - other.learned)
            d.evicted = max(0, evicted - other.evicted)
            return d
        }
    }

    public enum Counted: Sendable {
        case allowed, waited, rejected, left
    }

    /// Counts a try's decision other than going at once (which `acquire` counts).
    public func count(policy: String, _ what: Counted) {
        state.withLock { state in
            switch what {
            case .allowed: state.counts[policy, default: Counts()].allowed += 1
            case .waited: state.counts[policy, default: Counts()].waited += 1
            case .rejected: state.counts[policy, default: Counts()].rejected += 1
            case .left: state.counts[policy, default: Counts()].left += 1
            }
        }
    }

    /// What `GET /limits` shows of one policy.
    public struct PolicyState: Sendable {
        public let policy: String
        /// Keys with a schedule, over every table of the policy.
        public let keys: Int
        public let waiting: Int
        public let inFlight: Int
        /// Keys forgotten to stay within the table's capacity, since the process started.
        public let evicted: Int
        public let counts: Counts
        /// The origin's holds still running: key, µs left, why.
        public let holds: [(key: String, remaining: Int64, reason: String)]
    }

    /// Every policy's state (for `GET /limits` and `/metrics`), sorted by policy.
    public func snapshot(now: Int64) -> [PolicyState] {
        state.withLock { state in
            var policies = Set(state.tables.keys)
            policies.formUnion(state.waiting.keys)
            policies.formUnion(state.counts.keys)
            policies.formUnion(state.holds.keys.map(\.policy))
            policies.formUnion(state.waiters.values.map(\.key.policy))
            policies.formUnion(state.concurrency.keys.compactMap { $0.split(separator: "\u{0}").first.map(String.init) })
            return policies.sorted().map { policy in
                let holds = state.holds.filter { $0.key.policy == policy && $0.value.until > now }
                    .map { (key: $0.key.key, remaining: $0.value.until - now, reason: $0.value.reason) }
                    .sorted { $0.key < $1.key }
                let inFlight = state.concurrency.inFlight(prefix: policy + "\u{0}")
                let tables = state.tables[policy] ?? []
                var counts = state.counts[policy] ?? Counts()
                counts.allowed += tables.reduce(0) { $0 + $1.allowed }
                counts.evicted += tables.reduce(0) { $0 + $1.evicted }
                return PolicyState(
                    policy: policy, keys: tables.reduce(0) { $0 + $1.keyCount },
                    waiting: state.waiting[policy] ?? 0, inFlight: inFlight,
                    evicted: counts.evicted, counts: counts, holds: holds)
            }
        }
    }
}

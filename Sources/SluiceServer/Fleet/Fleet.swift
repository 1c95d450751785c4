import CLibEvent
import SluiceCore
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// What the whole process knows of its fleet (`fleet:`, docs/fleet.md): its own name among the
/// instances, how many were alive at the last heartbeat, and the fallback decisions made.
///
/// Threading: any thread (atomics).
final class FleetShared: Sendable {
    /// This instance's name in the heartbeat set: random per process, from the system's
    /// generator (`getrandom`), not OpenSSL's: every process makes one, and the first
    /// `RAND_bytes` initialises OpenSSL (its configuration file, error tables and random
    /// generator: 1.9 MiB of libcrypto made resident) in a process whose configuration may
    /// use neither a fleet nor TLS.
    let instance: String
    /// Instances alive at the last heartbeat (this one included; 1 until one answered).
    let instancesAlive = Atomic<Int>(1)
    /// Decisions taken by `on_redis_down` while Redis did not answer.
    let fallbacks = Atomic<Int>(0)
    /// Episodes of Redis not answering, over every worker (each logged once when it starts).
    let episodes = Atomic<Int>(0)

    init() {
        var generator = SystemRandomNumberGenerator()
        instance = Hex.lowercase(withUnsafeBytes(of: generator.next()) { Array($0) })
    }
}

/// The fleet's answer to one try's rate limits.
enum FleetAnswer {
    /// Go after `delay` µs (its place in the fleet's schedule is taken; `places` − 1 more were
    /// taken for the tries after it: a lease, `Fleet.takeLease`).
    case go(delay: Int64, places: Int)
    /// Over a limit for longer than the try may wait: µs until it could go, and which limit
    /// (an index into the policy's limits; nil: the origin's hold).
    case refuse(retryAfter: Int64, limit: Int?)
    /// Redis did not answer in time, or is not usable now: `on_redis_down` decides.
    case unavailable(String)
}

/// One worker's part of the fleet: its `RedisClient`, the keys of a decision, and (on worker
/// 0) the heartbeat that counts the instances alive.
///
/// Threading: one per worker, on its thread.
final class Fleet {
    let settings: FleetSettings
    let client: RedisClient
    let shared: FleetShared
    private var heartbeatTimer: LoopTimer<Fleet>?
    /// The shared cache whose members the heartbeat publishes and learns (worker 0, with
    /// `fleet.cache` and no static `peers`; nil otherwise).
    private let members: FleetPeers?
    /// The token polls waiting for their next try (`awaitToken`), by number; dropped at close.
    private var polls: [UInt64: TokenPoll] = [:]
    private var nextPoll: UInt64 = 0

    private let base: OpaquePointer
    /// The fetch locks this worker holds, by token key: the random value it set.
    private var locks: [String: String] = [:]
    private var lockCounter = 0

    /// Worker 0's second connection, subscribed to the fleet's circuit news (`circuitOpened`).
    private var subscriber: RedisClient?

    init(
        base: OpaquePointer, settings: FleetSettings, shared: FleetShared, workerIndex: Int,
        health: UpstreamHealth? = nil, peers: FleetPeers? = nil
    ) {
        self.settings = settings
        self.shared = shared
        members = workerIndex == 0 && peers?.learnsFromRedis == true ? peers : nil
        client = RedisClient(base: base, settings: settings, workerIndex: workerIndex)
        client.onEpisode = { started in if started { shared.episodes.add(1, ordering: .relaxed) } }
        client.scripts = [
            FleetScripts.acquire, FleetScripts.hold, FleetScripts.heartbeat, FleetScripts.token, FleetScripts.store,
            FleetScripts.compareAndDelete, FleetScripts.trial,
        ]
        self.base = base
        if workerIndex == 0, let health {
            let subscriber = RedisClient(base: base, settings: settings, workerIndex: workerIndex)
            let instance = shared.instance
            subscriber.subscribe(settings.keyPrefix + "circuits") { payload in
                Self.circuitNews(payload, from: instance, health)
            }
            self.subscriber = subscriber
        }
        if workerIndex == 0 {
            let timer = LoopTimer(on: base, owner: self) { $0.beat() }
            timer.arm(milliseconds: settings.heartbeat)
            heartbeatTimer = timer
        }
    }

    func start() {
        client.connect()
        subscriber?.connect()
        // The first beat as soon as the connection can carry it.
        heartbeatTimer?.arm(milliseconds: 50)
    }

    /// The fixed part of an acquire for one set of limits: the schedule key's suffix, and the
    /// limits' arguments encoded once.
    private struct Prepared {
        let suffix: String
        let limitWords: [UInt8]
        let count: Int
    }
    private var prepared: [[RateLimit]: Prepared] = [:]
    /// Places the fleet gave this worker ahead (a lease), per schedule key: how many are left
    /// and until when they may be used (µs); unused ones are lost.
    private var leases: [String: [String: Lease]] = [:]
    private struct Lease {
        let limits: [RateLimit]
        var left: Int
        let until: Int64
    }
    /// How long a lease's places may be used.
    static let leaseMicroseconds: Int64 = 50_000

    /// How many places a try asks for at once under `limits`: a quarter of the smallest burst,
    /// at most 32 (1 — no lease — for a burst under 8): a lease never takes more than the
    /// limit would let go at once anyway.
    static func leaseSize(_ limits: [RateLimit]) -> Int {
        guard let burst = limits.map(\.burst).min() else { return 1 }
        let size = min(32, burst / 4)
        return size >= 2 ? size : 1
    }

    /// A place from this worker's lease for `key`, if one is left and still valid: the try goes
    /// without a round trip.
    func takeLease(policy: String, limits: [RateLimit], key: String, now: Int64) -> Bool {
        guard !leases.isEmpty, var lease = leases[policy]?[key] else { return false }
        guard lease.until > now, lease.left > 0, lease.limits == limits else {
            leases[policy]?[key] = nil
            return false
        }
        lease.left -= 1
        leases[policy]![key] = lease.left > 0 ? lease : nil
        return true
    }

    private func keepLease(policy: String, key: String, _ lease: Lease) {
        if leases[policy, default: [:]].count >= 10_000 { leases[policy] = [:] }
        leases[policy, default: [:]][key] = lease
    }

    /// Each policy's keys' hash tags (a SHA-256 per new key, not per request); bounded.
    private var tags: [String: [String: String]] = [:]

    /// Asks the fleet's schedule of `key` under `limits` (and the origin's hold) for a try that
    /// may wait `maxWait` µs; `completion` is called once, on this thread.
    func acquire(
        policy: String, limits: [RateLimit], key: String, maxWait: Int64, coalesce: Bool = true,
        completion: @escaping (FleetAnswer) -> Void
    ) {
        let tag = cachedTag(policy: policy, key: key)
        let fixed = prepare(limits)
        let scheduleKey = tag + fixed.suffix
        let lease = Self.leaseSize(limits)
        if lease > 1 && coalesce {
            // One round trip at a time per key: the tries that come meanwhile are served from
            // the lease it brings back (the rest ask again).
            if inFlight[scheduleKey] != nil {
                let deadline = MonotonicClock.microseconds() + maxWait
                inFlight[scheduleKey]!.append(
                    Waiter(policy: policy, limits: limits, key: key, deadline: deadline, completion: completion))
                return
            }
            inFlight[scheduleKey] = []
        }
        let holdKey = tag + ":hold"
        let build = { (verb: String, script: String) -> [UInt8] in
            var command = RESPCommand(count: fixed.count)
            command.append(verb)
            command.append(script)
            command.append(encoded: Self.two)
            command.append(scheduleKey)
            command.append(holdKey)
            command.append(encoded: fixed.limitWords)
            command.append(maxWait)
            command.append(Int64(lease))
            return command.bytes
        }
        // Unowned: the client calls back only while it is open, and the fleet closes it first.
        client.eval(FleetScripts.acquire, build: build) { [unowned(unsafe) self] reply in
            let answer = Self.answer(reply)
            if case .go(let delay, let n) = answer, n > 1 {
                let until = MonotonicClock.microseconds() + delay + Self.leaseMicroseconds
                self.keepLease(policy: policy, key: key, Lease(limits: limits, left: n - 1, until: until))
            }
            completion(answer)
            self.serveWaiters(scheduleKey, answer)
        }
    }

    /// A try that came while its key's round trip was out.
    private struct Waiter {
        let policy: String
        let limits: [RateLimit]
        let key: String
        /// The latest it may go (monotonic µs): what is left of its wait when it asks again.
        let deadline: Int64
        let completion: (FleetAnswer) -> Void
    }
    private var inFlight: [String: [Waiter]] = [:]

    /// The round trip for `scheduleKey` came back: the tries that waited for it go from its
    /// lease while places last, share its refusal or its failure, or ask again.
    private func serveWaiters(_ scheduleKey: String, _ answer: FleetAnswer) {
        guard let waiters = inFlight.removeValue(forKey: scheduleKey) else { return }
        let now = MonotonicClock.microseconds()
        var again: [Waiter] = []
        for waiter in waiters {
            switch answer {
            case .go:
                if takeLease(policy: waiter.policy, limits: waiter.limits, key: waiter.key, now: now) {
                    waiter.completion(.go(delay: 0, places: 1))
                } else {
                    again.append(waiter)
                }
            case .refuse, .unavailable:
                waiter.completion(answer)
            }
        }
        // The round trip brought no place to spare (the limit is reached): each asks for
        // itself now, at once, with what is left of its wait.
        for waiter in again {
            acquire(
                policy: waiter.policy, limits: waiter.limits, key: waiter.key, maxWait: max(0, waiter.deadline - now),
                coalesce: false, completion: waiter.completion)
        }
    }

    private static func answer(_ reply: RedisReply) -> FleetAnswer {
        guard case .array(let items) = reply, items.count >= 2, case .integer(let ok) = items[0],
            case .integer(let micros) = items[1]
        else {
            if case .failed(let why) = reply { return .unavailable(why) }
            return .unavailable("unexpected answer \(reply)")
        }
        if ok == 1 {
            var places = 1
            if items.count >= 3, case .integer(let n) = items[2], n > 1 { places = n }
            return .go(delay: Int64(micros), places: places)
        }
        var limit: Int? = nil
        if items.count >= 3, case .integer(let index) = items[2], index > 0 { limit = index - 1 }
        return .refuse(retryAfter: Int64(micros), limit: limit)
    }

    private static let two = RESPCommand.word("2")

    private func prepare(_ limits: [RateLimit]) -> Prepared {
        if let p = prepared[limits] { return p }
        var words = RESPCommand.word(String(limits.count))
        for limit in limits {
            words += RESPCommand.word(String(limit.interval))
            words += RESPCommand.word(String(limit.tolerance))
        }
        // EVALSHA, the SHA, the key count, two keys, n, 2 per limit, the wait, the lease.
        let p = Prepared(suffix: ":rl:" + Self.digest(limits), limitWords: words, count: 8 + 2 * limits.count)
        if prepared.count > 64 { prepared.removeAll() }  // reloads that changed limits, many times
        prepared[limits] = p
        return p
    }

    private func cachedTag(policy: String, key: String) -> String {
        if let tag = tags[policy]?[key] { return tag }
        let tag = tag(policy: policy, key: key)
        if tags[policy, default: [:]].count >= 10_000 { tags[policy] = [:] }
        tags[policy, default: [:]][key] = tag
        return tag
    }

    /// Tells the fleet that the origin asked for no requests of `key` for `milliseconds`.
    func learn(policy: String, key: String, milliseconds: Int) {
        guard client.isUsable else { return }
        client.eval(
            FleetScripts.hold, keys: [tag(policy: policy, key: key) + ":hold"], args: [String(milliseconds)]
        ) { _ in }
    }

    private func beat() {
        let ms = settings.heartbeat
        heartbeatTimer?.arm(milliseconds: ms)
        let members = members
        guard client.isConnected else {
            members?.missed()
            return
        }
        let shared = shared
        var keys = [settings.keyPrefix + "instances"]
        var args = [shared.instance, String(ms * 3)]
        if let members {
            keys.append(settings.keyPrefix + "cache:members")
            args.append(members.membership.heartbeatEntry)
        }
        client.eval(FleetScripts.heartbeat, keys: keys, args: args) { reply in
            switch reply {
            case .integer(let n) where n > 0:
                shared.instancesAlive.store(n, ordering: .relaxed)
            case .array(let items) where items.count == 3:
                guard case .integer(let n) = items[0], case .integer(let now) = items[1], case .array(let entries) = items[2]
                else {
                    members?.missed()
                    return
                }
                if n > 0 { shared.instancesAlive.store(n, ordering: .relaxed) }
                let flat = entries.compactMap { entry -> String? in
                    if case .string(let text) = entry { return text }
                    return nil
                }
                members?.heard(FleetMembership.beats(flat), now: Int64(now))
            default:
                members?.missed()
            }
        }
    }

    /// `PREFIX{policy|hash}`: the hash tag of one key's decision. The key is hashed, so a key
    /// that is a credential (`key: header:X-Api-Key`) never reaches Redis as written.
    private func tag(policy: String, key: String) -> String {
        let digest = Crypto.sha256(Array(key.utf8))
        return settings.keyPrefix + "{" + policy + "|" + Hex.lowercase(digest.prefix(12)) + "}"
    }

    /// The limits in a key's name: a change of limits starts a new schedule.
    private static func digest(_ limits: [RateLimit]) -> String {
        limits.map { "\($0.requests)-\($0.periodMilliseconds)-\($0.burst)" }.joined(separator: "_")
    }

    /// This instance opened its circuit to `origin` for `milliseconds` (0: closed it): the
    /// fleet's other instances do the same (worker 0 of each listens, `circuitNews`).
    func circuitOpened(_ origin: String, milliseconds: Int) {
        guard client.isUsable else { return }
        client.send(["PUBLISH", settings.keyPrefix + "circuits", "\(milliseconds) \(shared.instance) \(origin)"]) { _ in }
    }

    /// `MS INSTANCE ORIGIN` from the circuit channel: another instance opened its circuit (MS
    /// above 0: this one's opens at the origin's next try, until the same end) or closed it
    /// (0: its trial or probe found the origin well; this one's closes).
    static func circuitNews(_ payload: String, from me: String, _ health: UpstreamHealth) {
        let parts = payload.split(separator: " ", maxSplits: 2).map(String.init)
        guard parts.count == 3, let ms = Int(parts[0]), ms >= 0, ms <= 86_400_000, parts[1] != me else { return }
        if ms == 0 {
            health.closedElsewhere(parts[2])
            Log.info("upstream \(parts[2]): circuit closed by another instance of the fleet; the origin answers again")
            return
        }
        health.openedElsewhere(parts[2], milliseconds: ms, now: MonotonicClock.milliseconds())
        Log.warning(
            "upstream \(parts[2]): circuit opened by another instance of the fleet; requests fail fast with 503 for \(ms) ms")
    }

    /// Takes the fleet's lock on `origin`'s trial (or probe) for `milliseconds`: `true`, this
    /// instance tries the origin; `false`, another does; `nil`, Redis cannot tell (this instance
    /// tries, as alone).
    func lockTrial(_ origin: String, milliseconds: Int, completion: @escaping (Bool?) -> Void) {
        guard client.isUsable else { return completion(nil) }
        let key = settings.keyPrefix + "{circuit|" + origin + "}:trial"
        client.eval(FleetScripts.trial, keys: [key], args: [shared.instance, String(max(1, milliseconds))]) { reply in
            switch reply {
            case .integer(1): completion(true)
            case .integer(0): completion(false)
            default: completion(nil)
            }
        }
    }

    func close() {
        subscriber?.close()
        heartbeatTimer = nil
        polls.removeAll()
        client.close()
    }
}

// MARK: OAuth 2 tokens (oauth2, share: true)

/// The fleet's token store: `PREFIX{oauth|HASH}:token` (the token, with the lifetime the token
/// endpoint gave) and `…:lock` (who fetches now: `SET NX PX 10000` with a value of this
/// instance's, given back with a compare-and-delete). HASH is `OAuth2Authenticator.sharedKey`:
/// the client id is not in the key as written.
extension Fleet: SharedTokenStore {
    private func keys(_ key: String) -> (token: String, lock: String) {
        let tag = settings.keyPrefix + "{oauth|" + key + "}"
        return (tag + ":token", tag + ":lock")
    }

    func token(_ key: String, completion: @escaping (SharedToken) -> Void) {
        guard client.isUsable else { return completion(.unavailable) }
        let k = keys(key)
        client.eval(FleetScripts.token, keys: [k.token, k.lock], args: []) { reply in
            switch reply {
            case .array(let items):
                guard items.count == 2, case .string(let token) = items[0], case .integer(let ms) = items[1] else {
                    return completion(.unavailable)
                }
                completion(ms > 0 ? .found(token: token, milliseconds: ms) : .none)
            case .integer: completion(.none)
            default: completion(.unavailable)
            }
        }
    }

    func lock(_ key: String, completion: @escaping (Bool?) -> Void) {
        guard client.isUsable else { return completion(nil) }
        lockCounter += 1
        let value = shared.instance + "-" + String(lockCounter)
        let lockKey = keys(key).lock
        client.send(["SET", lockKey, value, "NX", "PX", "10000"]) { [unowned(unsafe) self] reply in
            switch reply {
            case .status("OK"):
                self.locks[lockKey] = value
                completion(true)
            case .null: completion(false)
            default: completion(nil)
            }
        }
    }

    /// Polls every 25 ms, for at most 5 s: the token, once stored; `.none` as soon as the lock
    /// is given back without one; `.unavailable` when Redis stops answering.
    func awaitToken(_ key: String, completion: @escaping (SharedToken) -> Void) {
        let deadline = MonotonicClock.milliseconds() + 5000
        poll(key, deadline: deadline, completion)
    }

    private func poll(_ key: String, deadline: Int, _ completion: @escaping (SharedToken) -> Void) {
        nextPoll += 1
        let poll = TokenPoll(fleet: self, number: nextPoll, key: key, deadline: deadline, completion: completion)
        poll.timer = LoopTimer(on: base, owner: poll) { $0.fleet.pollFired($0) }
        poll.timer?.arm(milliseconds: 25)
        polls[poll.number] = poll
    }

    private func pollFired(_ poll: TokenPoll) {
        polls[poll.number] = nil
        let (key, deadline, completion) = (poll.key, poll.deadline, poll.completion)
        guard client.isUsable else { return completion(.unavailable) }
        let k = keys(key)
        client.eval(FleetScripts.token, keys: [k.token, k.lock], args: []) { [unowned(unsafe) self] reply in
            switch reply {
            case .array(let items):
                guard items.count == 2, case .string(let token) = items[0], case .integer(let ms) = items[1], ms > 0
                else { return completion(.none) }
                completion(.found(token: token, milliseconds: ms))
            case .integer(1) where MonotonicClock.milliseconds() < deadline:
                self.poll(key, deadline: deadline, completion)  // still fetching elsewhere
            case .integer:
                completion(.none)  // the lock was given back without a token, or the wait ran out
            default:
                completion(.unavailable)
            }
        }
    }

    func store(_ key: String, token: String, milliseconds: Int) {
        let k = keys(key)
        let value = locks.removeValue(forKey: k.lock) ?? ""
        guard client.isUsable else { return }
        client.eval(FleetScripts.store, keys: [k.token, k.lock], args: [token, String(max(1, milliseconds)), value]) { _ in }
    }

    func unlock(_ key: String) {
        let k = keys(key)
        guard let value = locks.removeValue(forKey: k.lock), client.isUsable else { return }
        client.eval(FleetScripts.store, keys: [k.token, k.lock], args: ["", "1", value]) { _ in }
    }

    func invalidate(_ key: String, token: String) {
        guard client.isUsable else { return }
        client.eval(FleetScripts.compareAndDelete, keys: [keys(key).token], args: [token]) { _ in }
    }
}

/// One worker's connection to the fleet's Redis, as `GET /fleet` shows it.
struct FleetWorkerState: Sendable, Encodable {
    let worker: Int
    /// `ready` (connected and asked), `paused` (failures: not asked for a while),
    /// `connecting` (no connection now), or `off` (no fleet).
    let state: String
    let consecutiveFailures: Int
    /// Round trips of the last (up to 256) commands that answered, in ms.
    let roundTripP50Ms: Double?
    let roundTripP99Ms: Double?
    let commands: Int

    enum CodingKeys: String, CodingKey {
        case worker, state, commands
        case consecutiveFailures = "consecutive_failures"
        case roundTripP50Ms = "round_trip_p50_ms"
        case roundTripP99Ms = "round_trip_p99_ms"
    }

    init(worker: Int) {
        self.worker = worker
        state = "off"
        consecutiveFailures = 0
        roundTripP50Ms = nil
        roundTripP99Ms = nil
        commands = 0
    }

    init(worker: Int, _ client: RedisClient) {
        self.worker = worker
        let now = MonotonicClock.milliseconds()
        state = !client.isConnected ? "connecting" : client.health.usable(now: now) ? "ready" : "paused"
        consecutiveFailures = client.health.consecutiveFailures
        let sorted = client.roundTrips.sorted()
        func quantile(_ q: Double) -> Double? {
            guard !sorted.isEmpty else { return nil }
            return Double(sorted[min(sorted.count - 1, Int(Double(sorted.count) * q))]) / 1000
        }
        roundTripP50Ms = quantile(0.5)
        roundTripP99Ms = quantile(0.99)
        commands = client.answered
    }
}

/// A token poll waiting for its next try (`Fleet.awaitToken`): what the try needs, and the
/// timer that starts it. Held by its fleet's `polls` until the timer fires or the fleet closes.
///
/// Threading: its worker's thread only.
private final class TokenPoll {
    let number: UInt64
    let key: String
    let deadline: Int
    let completion: (SharedToken) -> Void
    unowned(unsafe) let fleet: Fleet
    var timer: LoopTimer<TokenPoll>?

    init(fleet: Fleet, number: UInt64, key: String, deadline: Int, completion: @escaping (SharedToken) -> Void) {
        self.fleet = fleet
        self.number = number
        self.key = key
        self.deadline = deadline
        self.completion = completion
    }
}

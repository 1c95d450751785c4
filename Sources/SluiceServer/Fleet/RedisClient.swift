import CHiredis
import CLibEvent
import COpenSSL
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// A reply from Redis, as Swift values.
enum RedisReply {
    case integer(Int)
    case string(String)
    case array([RedisReply])
    case null
    case status(String)
    case error(String)
    /// No reply within `fleet.timeout`, the connection was lost, or none was open.
    case failed(String)

    init(_ reply: UnsafeMutablePointer<redisReply>) {
        let r = reply.pointee
        switch r.type {
        case REDIS_REPLY_INTEGER: self = .integer(Int(r.integer))
        case REDIS_REPLY_NIL: self = .null
        case REDIS_REPLY_ARRAY:
            var items: [RedisReply] = []
            for i in 0..<r.elements {
                if let element = r.element[i] { items.append(RedisReply(element)) }
            }
            self = .array(items)
        default:
            let text = r.str.map { String(decoding: UnsafeRawBufferPointer(start: $0, count: r.len), as: UTF8.self) } ?? ""
            switch r.type {
            case REDIS_REPLY_STATUS: self = .status(text)
            case REDIS_REPLY_ERROR: self = .error(text)
            default: self = .string(text)
            }
        }
    }
}

/// A Lua script Sluice runs in Redis: its text and its SHA-1 (what `EVALSHA` names it by,
/// computed here, so no `SCRIPT LOAD` round trip is needed; `NOSCRIPT` — a Redis that
/// restarted or was flushed — is answered by sending the text once with `EVAL`).
struct RedisScript: Sendable {
    let text: String
    let sha: String

    init(_ text: String) {
        self.text = text
        var digest = [UInt8](repeating: 0, count: Int(SHA_DIGEST_LENGTH))
        let bytes = Array(text.utf8)
        _ = SHA1(bytes, bytes.count, &digest)
        sha = Hex.lowercase(digest)
    }
}

/// A command in Redis's protocol (RESP): an array of bulk strings, built as bytes (no
/// formatting by hiredis); fixed parts can be encoded once (`word`) and appended as they are.
struct RESPCommand {
    private(set) var bytes: [UInt8] = []

    init(count: Int) {
        bytes.reserveCapacity(160)
        bytes.append(UInt8(ascii: "*"))
        ASCII.appendDecimal(count, to: &bytes)
        bytes += [13, 10]
    }

    mutating func append(_ word: String) {
        var word = word
        word.withUTF8 { Self.appendWord($0, to: &bytes) }
    }

    mutating func append(_ number: Int64) {
        var digits: [UInt8] = []
        digits.reserveCapacity(20)
        ASCII.appendDecimal(Int(number), to: &digits)
        digits.withUnsafeBufferPointer { Self.appendWord($0, to: &bytes) }
    }

    /// Words encoded by `word`, appended as they are.
    mutating func append(encoded: [UInt8]) { bytes += encoded }

    /// `word` as a bulk string, to append later with `append(encoded:)`.
    static func word(_ word: String) -> [UInt8] {
        var out: [UInt8] = []
        var word = word
        word.withUTF8 { appendWord($0, to: &out) }
        return out
    }

    private static func appendWord(_ word: UnsafeBufferPointer<UInt8>, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "$"))
        ASCII.appendDecimal(word.count, to: &out)
        out += [13, 10]
        out.append(contentsOf: word)
        out += [13, 10]
    }

}

/// One worker's connection to the fleet's Redis (`fleet:`, docs/fleet.md): hiredis 0.14's
/// asynchronous context on the worker's own `event_base` (its libevent adapter), so no thread
/// is added and no call blocks. What hiredis 0.14 lacks is here: every command has its own
/// timer (`fleet.timeout`: it then fails, and a late reply is dropped), a connection attempt
/// has one too, and a lost connection is made again after a pause that grows to 5 s.
/// `AUTH` and `SELECT` go first on every new connection. Failures feed `RedisHealth`: after a
/// few, the worker stops asking for a while, and callers fall back at once.
///
/// Threading: one per worker, touched only on the worker's thread; hiredis calls back on it.
/// The context's `data` is this object, unretained: the worker keeps it and `close()`s it
/// before its loop ends.
final class RedisClient {
    typealias Completion = (RedisReply) -> Void

    /// A command waiting for its reply, and when it times out (monotonic µs).
    private struct Pending {
        let completion: Completion
        let sent: Int
        let deadline: Int
    }

    let settings: FleetSettings
    private let base: OpaquePointer
    private let workerIndex: Int
    private var context: UnsafeMutablePointer<redisAsyncContext>?
    private var connected = false
    /// The timers, dropped by `close()`.
    private var connectTimer: LoopTimer<RedisClient>?
    private var reconnectTimer: LoopTimer<RedisClient>?
    private var reconnectPause = 100
    private var pending: [UInt64: Pending] = [:]
    /// Ids in the order they were sent (their deadlines are in the same order: one timeout for
    /// all); ids already answered are skipped when the timer looks.
    private var order: [UInt64] = []
    private var orderHead = 0
    /// One timer for the oldest command still waiting.
    private var timeoutTimer: LoopTimer<RedisClient>?
    private var timeoutArmed = false
    private var nextId: UInt64 = 0
    private(set) var health = RedisHealth()
    private var closed = false
    private var lastRefusal: String?
    /// Round trips of commands that answered in time, in µs (the last 256, for `/fleet`).
    private(set) var roundTrips: [Int] = []
    private var roundTripIndex = 0
    /// Commands answered in time since the worker started.
    private(set) var answered = 0
    /// Told when an episode of failures starts (true) or ends (false).
    var onEpisode: ((Bool) -> Void)?
    /// A subscriber's channel and what it is told of each message (`subscribe`); such a
    /// client sends nothing else.
    private var subscription: (channel: String, onMessage: (String) -> Void)?

    /// Loaded on every new connection, right after AUTH and SELECT (so that no EVALSHA meets
    /// NOSCRIPT and overtakes a command sent before it).
    var scripts: [RedisScript] = []

    init(base: OpaquePointer, settings: FleetSettings, workerIndex: Int) {
        self.base = base
        self.settings = settings
        self.workerIndex = workerIndex
        connectTimer = LoopTimer(on: base, owner: self) { $0.connectTimedOut() }
        reconnectTimer = LoopTimer(on: base, owner: self) { $0.connect() }
        timeoutTimer = LoopTimer(on: base, owner: self) { $0.expire() }
    }

    /// Whether a command may be sent now (connected, and not paused after failures).
    var isUsable: Bool { connected && health.usable(now: MonotonicClock.milliseconds()) }
    var isConnected: Bool { connected }

    func connect() {
        guard !closed, context == nil else { return }
        let ac: UnsafeMutablePointer<redisAsyncContext>?
        switch settings.redis {
        case .tcp(let host, let port): ac = redisAsyncConnect(host, Int32(port))
        case .unix(let path): ac = redisAsyncConnectUnix(path)
        }
        guard let ac, ac.pointee.err == 0 else {
            let why = ac.flatMap { $0.pointee.errstr.map { String(cString: $0) } } ?? "out of memory"
            if let ac { redisAsyncFree(ac) }
            return lost("cannot connect: \(why)")
        }
        ac.pointee.data = Unmanaged.passUnretained(self).toOpaque()
        guard redisLibeventAttach(ac, base) == REDIS_OK else {
            redisAsyncFree(ac)
            return lost("cannot attach to the event loop")
        }
        context = ac
        redisAsyncSetConnectCallback(ac) { ac, status in
            guard let data = ac?.pointee.data else { return }
            Unmanaged<RedisClient>.fromOpaque(data).takeUnretainedValue().connectEnded(status == REDIS_OK, ac)
        }
        redisAsyncSetDisconnectCallback(ac) { ac, status in
            guard let data = ac?.pointee.data else { return }
            let why = status == REDIS_OK ? "closed" : (ac?.pointee.errstr.map { String(cString: $0) } ?? "connection lost")
            Unmanaged<RedisClient>.fromOpaque(data).takeUnretainedValue().disconnected(why)
        }
        connectTimer?.arm(milliseconds: 1000)
    }

    /// The first commands on a new connection (their deadlines start now that it is up).
    private func setUp(_ ac: UnsafeMutablePointer<redisAsyncContext>) {
        if let password = settings.password?.value {
            let args = settings.username.map { ["AUTH", $0, password] } ?? ["AUTH", password]
            send(args) { [unowned(unsafe) self] reply in
                if case .error(let text) = reply { self.refused("AUTH: \(text)") }
            }
        }
        if settings.database != 0 {
            send(["SELECT", String(settings.database)]) { [unowned(unsafe) self] reply in
                if case .error(let text) = reply { self.refused("SELECT \(self.settings.database): \(text)") }
            }
        }
        for script in scripts { send(["SCRIPT", "LOAD", script.text]) { _ in } }
        if let subscription { sendSubscribe(ac, subscription.channel) }
    }

    /// Makes this client a subscriber of `channel` (again on every new connection): each
    /// message's payload goes to `onMessage`, on this thread.
    func subscribe(_ channel: String, onMessage: @escaping (String) -> Void) {
        subscription = (channel, onMessage)
        if connected, let ac = context { sendSubscribe(ac, channel) }
    }

    private func sendSubscribe(_ ac: UnsafeMutablePointer<redisAsyncContext>, _ channel: String) {
        var command = RESPCommand(count: 2)
        command.append("SUBSCRIBE")
        command.append(channel)
        // hiredis keeps a subscription's callback for every message that follows.
        _ = Self.sendFormatted(ac, command.bytes, nil) { ac, reply, _ in
            guard let data = ac?.pointee.data, let reply else { return }
            let answer = RedisReply(reply.assumingMemoryBound(to: redisReply.self))
            Unmanaged<RedisClient>.fromOpaque(data).takeUnretainedValue().published(answer)
        }
    }

    private func published(_ reply: RedisReply) {
        guard case .array(let items) = reply, items.count == 3, case .string("message") = items[0],
            case .string(let payload) = items[2]
        else { return }
        subscription?.onMessage(payload)
    }

    private func connectEnded(_ ok: Bool, _ ac: UnsafePointer<redisAsyncContext>?) {
        connectTimer?.stop()
        guard ok else {
            // hiredis frees the context after this callback.
            let why = ac?.pointee.errstr.map { String(cString: $0) } ?? "refused"
            context = nil
            return lost("cannot connect to \(settings.redis): \(why)")
        }
        if let ac = context {
            // TCP keepalive: a peer gone without a reset is noticed (not for a Unix socket,
            // where hiredis would mark the context failed).
            if case .tcp = settings.redis { _ = redisEnableKeepAlive(&ac.pointee.c) }
            setUp(ac)
        }
        connected = true
        reconnectPause = 100
        Log.debug("worker \(workerIndex): fleet: connected to Redis at \(settings.redis)")
    }

    private func connectTimedOut() {
        guard let ac = context, !connected else { return }
        // Freeing a context calls every pending command back with no reply.
        context = nil
        ac.pointee.data = nil
        redisAsyncFree(ac)
        failAll("no connection within 1 s")
        lost("cannot connect to \(settings.redis) within 1 s")
    }

    private func disconnected(_ why: String) {
        // hiredis frees the context after this callback; the commands it held were called
        // back with no reply already.
        context = nil
        connected = false
        connectTimer?.stop()
        failAll(why)
        lost("connection to \(settings.redis) lost: \(why)")
    }

    /// Redis refused AUTH or SELECT: the connection is closed and made again later (logged once
    /// until a command succeeds).
    private func refused(_ why: String) {
        if lastRefusal != why {
            lastRefusal = why
            Log.error("worker \(workerIndex): fleet: Redis at \(settings.redis) refused \(why); retrying")
        }
        guard let ac = context else { return }
        redisAsyncDisconnect(ac)
    }

    private func lost(_ why: String) {
        connected = false
        guard !closed else { return }
        noteFailure(why)
        reconnectTimer?.arm(milliseconds: reconnectPause)
        reconnectPause = min(reconnectPause * 2, RedisHealth.maxPause)
    }

    private func noteFailure(_ why: String) {
        if health.failed(now: MonotonicClock.milliseconds()) {
            Log.warning(
                "worker \(workerIndex): fleet: Redis at \(settings.redis) is not answering (\(why)); limits fall back to on_redis_down: \(settings.onRedisDown.rawValue)"
            )
            onEpisode?(true)
        }
    }

    private func noteSuccess(sent: Int) {
        let rtt = max(0, Int(MonotonicClock.microseconds()) - sent)
        answered += 1
        lastRefusal = nil
        if roundTrips.count < 256 {
            roundTrips.append(rtt)
        } else {
            roundTrips[roundTripIndex] = rtt
            roundTripIndex = (roundTripIndex + 1) % 256
        }
        if health.succeeded() {
            Log.info("worker \(workerIndex): fleet: Redis at \(settings.redis) answers again; fleet limits apply")
            onEpisode?(false)
        }
    }

    private func failAll(_ why: String) {
        let all = order[orderHead...].compactMap { pending[$0] }
        pending.removeAll()
        order.removeAll()
        orderHead = 0
        if timeoutArmed {
            timeoutTimer?.stop()
            timeoutArmed = false
        }
        for p in all { p.completion(.failed(why)) }
    }

    /// Runs `script` (`EVALSHA`, or `EVAL` after `NOSCRIPT`); `completion` is called once,
    /// on this thread, within `fleet.timeout` — with `.failed` when Redis is not usable now.
    /// `build` encodes the command given its first two words (`EVALSHA` and the SHA, or `EVAL`
    /// and the text).
    func eval(
        _ script: RedisScript, build: @escaping (_ verb: String, _ script: String) -> [UInt8],
        completion: @escaping Completion
    ) {
        send(build("EVALSHA", script.sha)) { [unowned(unsafe) self] reply in
            // Unowned: a client calls back only while open (`close` fails what is pending).
            if case .error(let text) = reply, text.hasPrefix("NOSCRIPT") {
                // Redis lost its scripts (a restart, SCRIPT FLUSH): the text goes once more.
                self.send(build("EVAL", script.text), completion)
                return
            }
            completion(reply)
        }
    }

    /// `eval` with the keys and arguments as words.
    func eval(_ script: RedisScript, keys: [String], args: [String], completion: @escaping Completion) {
        eval(
            script,
            build: { verb, name in
                var command = RESPCommand(count: 3 + keys.count + args.count)
                for word in [verb, name, String(keys.count)] + keys + args { command.append(word) }
                return command.bytes
            }, completion: completion)
    }

    /// Sends one command given as its words.
    func send(_ args: [String], _ completion: @escaping Completion) {
        var command = RESPCommand(count: args.count)
        for arg in args { command.append(arg) }
        send(command.bytes, completion)
    }

    /// Sends one command, encoded; `completion` gets its reply, or `.failed` on a timeout, a
    /// lost connection, or when there is none.
    func send(_ bytes: [UInt8], _ completion: @escaping Completion) {
        guard let ac = context else { return completion(.failed("not connected")) }
        nextId &+= 1
        if nextId == 0 { nextId = 1 }
        let id = nextId
        let now = Int(MonotonicClock.microseconds())
        pending[id] = Pending(completion: completion, sent: now, deadline: now + settings.timeout * 1000)
        order.append(id)
        if !timeoutArmed { arm(microseconds: settings.timeout * 1000) }
        let status = Self.sendFormatted(ac, bytes, UnsafeMutableRawPointer(bitPattern: UInt(id))) { ac, reply, privdata in
            guard let data = ac?.pointee.data else { return }
            let id = UInt64(UInt(bitPattern: privdata))
            let answer = reply.map { RedisReply($0.assumingMemoryBound(to: redisReply.self)) }
            Unmanaged<RedisClient>.fromOpaque(data).takeUnretainedValue().answered(id, answer)
        }
        if status != REDIS_OK { answered(id, nil) }
    }

    /// Hands hiredis one encoded command, NUL-terminated: `redisAsyncFormattedCommand` takes a
    /// length, but 0.14 still scans the command with `strchr` for its name and, for a
    /// `SUBSCRIBE`, for every channel, and reads the byte after the last word — past the end
    /// of an unterminated buffer (AddressSanitizer's heap-buffer-overflow; an `assert(p)` in
    /// `nextArgument` when the bytes after it held a `$` and no `\r`). hiredis copies the
    /// command into its output buffer before it returns, so a temporary copy is enough.
    private static func sendFormatted(
        _ ac: UnsafeMutablePointer<redisAsyncContext>, _ bytes: [UInt8], _ privdata: UnsafeMutableRawPointer?,
        _ callback:
            @convention(c) (UnsafeMutablePointer<redisAsyncContext>?, UnsafeMutableRawPointer?, UnsafeMutableRawPointer?) -> Void
    ) -> Int32 {
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: bytes.count + 1) { buffer in
            let base = buffer.baseAddress!
            bytes.withUnsafeBytes { UnsafeMutableRawPointer(base).copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
            base[bytes.count] = 0
            return redisAsyncFormattedCommand(ac, callback, privdata, base, bytes.count)
        }
    }

    private func arm(microseconds: Int) {
        timeoutTimer?.arm(microseconds: microseconds)
        timeoutArmed = true
    }

    /// The timer: every command past its deadline fails; the timer is armed again for the
    /// oldest one still waiting.
    private func expire() {
        timeoutArmed = false
        let now = Int(MonotonicClock.microseconds())
        while orderHead < order.count {
            let id = order[orderHead]
            guard let p = pending[id] else {
                orderHead += 1
                continue
            }
            if p.deadline > now {
                arm(microseconds: p.deadline - now)
                break
            }
            orderHead += 1
            pending[id] = nil
            noteFailure("no answer within \(settings.timeout) ms")
            p.completion(.failed("no answer within \(settings.timeout) ms"))
        }
        compactOrder()
    }

    private func compactOrder() {
        if orderHead == order.count {
            order.removeAll(keepingCapacity: true)
            orderHead = 0
        } else if orderHead > 1024 {
            order.removeFirst(orderHead)
            orderHead = 0
        }
    }

    private func answered(_ id: UInt64, _ reply: RedisReply?) {
        guard let p = pending.removeValue(forKey: id) else { return }  // timed out already
        if pending.isEmpty {
            // Nothing waits: the timer stops, and the order starts afresh.
            order.removeAll(keepingCapacity: true)
            orderHead = 0
            if timeoutArmed {
                timeoutTimer?.stop()
                timeoutArmed = false
            }
        }
        if let reply {
            if case .error(let text) = reply, !text.hasPrefix("NOSCRIPT") {
                // An error answer (NOPERM, READONLY, OOM …) fails like a timeout, and is logged.
                noteFailure("Redis answered \(text)")
            } else {
                noteSuccess(sent: p.sent)
            }
            p.completion(reply)
        } else {
            noteFailure("connection lost")
            p.completion(.failed("connection lost"))
        }
    }

    /// Disconnects and drops the timers (the worker's loop has ended).
    func close() {
        closed = true
        connected = false
        reconnectTimer?.stop()
        connectTimer?.stop()
        if let ac = context {
            context = nil
            ac.pointee.data = nil
            redisAsyncFree(ac)
        }
        failAll("closing")
        reconnectTimer = nil
        connectTimer = nil
        timeoutTimer = nil
    }
}

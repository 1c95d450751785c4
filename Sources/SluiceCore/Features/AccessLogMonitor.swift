#if canImport(Glibc)
    import Glibc
#endif

/// The `access_log` monitor: one JSON object per line per finished exchange (and per closed
/// tunnel). Field names and meanings are listed in docs/configuration.md. URLs and error
/// messages pass through the `Redactor`; so does the finished line.
///
/// One instance per worker (see `LogMonitorFactory`): its formatting runs on that
/// worker's thread, its output goes to the shared `LogSink`'s writer thread.
public final class AccessLogMonitor: LogMonitor {
    public static let kind = "access_log"
    private let buffer: LogSink.Buffer
    private let redactor: Redactor
    /// The line being written, kept for its capacity: one line costs no allocation.
    private let line = JSONBuffer()
    /// The last line's `policy` field, copied whole while the policy stays the same.
    private var policyField = RepeatedField()

    public init(sink: LogSink, redactor: Redactor) {
        buffer = sink.makeBuffer()
        self.redactor = redactor
    }

    public var events: ProxyEvent.Kinds { [.finished, .tunnelClosed, .credentialRefreshed, .credentialRefreshFailed] }
    /// Only failed calls and `ctx.vars` are written (`LuaCallRecord.isLogged`).
    public var readsEveryScriptCall: Bool { false }

    /// The exchange's line, written from its record where it lies (no copy of it).
    public func exchangeEnded(_ summary: ExchangeSummary) {
        var json = JSONLine(reusing: line)
        lineBytes(summary, into: &json)
        let bytes = json.finishLine()
        // Scrubbed once, as a whole; a line without a secret goes out as written.
        if redactor.occursSecret(in: bytes) {
            buffer.append(bytes: redactor.scrub(bytes: Array(bytes)))
        } else {
            buffer.append(bytes: bytes)
        }
    }

    public func handle(_ event: ProxyEvent) {
        switch event {
        case .finished(let summary), .tunnelClosed(let summary):
            exchangeEnded(summary)
        case .credentialRefreshed(let source):
            buffer.append(eventLine("credential_refreshed", source: source, reason: nil))
        case .credentialRefreshFailed(let source, let reason):
            buffer.append(eventLine("credential_refresh_failed", source: source, reason: reason))
        default:
            break
        }
    }

    /// A line for an event that belongs to no single exchange (a token fetch): `time`,
    /// `event`, `source` and, for failures, `error`.
    func eventLine(_ event: StaticString, source: String, reason: String?) -> String {
        var json = JSONLine()
        json.timestamp("time")
        json.field("event", event.description)
        json.field("source", redactor.url(source))
        if let reason { json.field("error", redactor.scrub(reason)) }
        return redactor.scrub(json.finish())
    }

    /// One access-log line's fields, before the final scrub. Values that are one of a few
    /// words, and runs of fields at their usual values, are written as literals
    /// (`"method":"GET"`, `"retries":[],"retry_stopped":null,"validation":null`): one copy
    /// each instead of a key and an escape scan per field.
    private func lineBytes(_ s: ExchangeSummary, into json: inout JSONLine) {
        json.timestamp("time")
        json.integer(#""id":"#, s.id)
        json.string(#""client":"#, s.client)
        if let user = s.user { json.string(#""user":"#, user) } else { json.fields(#""user":null"#) }
        if let requestId = s.requestId { json.string(#""request_id":"#, requestId) }
        // The methods `HTTPRequestHead` reads as literals, which compare equal at once.
        switch s.method {
        case "GET": json.fields(#""method":"GET""#)
        case "POST": json.fields(#""method":"POST""#)
        case "HEAD": json.fields(#""method":"HEAD""#)
        case "PUT": json.fields(#""method":"PUT""#)
        default: json.string(#""method":"#, s.method)
        }
        json.string(#""url":"#, redactor.urlWithoutScrub(s.url))
        json.field("policy", s.policy, repeating: &policyField)
        json.integer(#""status":"#, s.status)
        json.integer(#""bytes_in":"#, s.bytesIn)
        json.integer(#""bytes_out":"#, s.bytesOut)
        if s.attempts == 1 && s.redirects == 0 {
            json.fields(#""attempts":1,"redirects":0"#)
        } else {
            json.integer(#""attempts":"#, s.attempts)
            json.integer(#""redirects":"#, s.redirects)
        }
        if let t = s.timings {
            json.timings("timings", t)
            if let version = t.httpVersion {
                if version == .http1_1 && !t.newConnection && t.engine == .native {
                    // The usual try (a reused connection of the native client): one literal.
                    json.fields(#""upstream_protocol":"HTTP/1.1","upstream_connection":"reused","upstream_engine":"native""#)
                } else {
                    json.fields(version.accessLogField)
                    json.fields(t.newConnection ? #""upstream_connection":"new""# : #""upstream_connection":"reused""#)
                    json.fields(t.engine?.accessLogField ?? #""upstream_engine":null"#)
                }
            } else {
                json.fields(#""upstream_protocol":null,"upstream_connection":null,"upstream_engine":null"#)
            }
        } else {
            json.null("timings")
        }
        let usualRetries = s.retries.isEmpty && s.retryStopped == nil && s.validation == nil
        if usualRetries && s.outcome == .ok && s.error == nil && !s.hasTrustFailure && !s.hasRateLimitRecord
            && !s.insecure && s.resumedAt.isEmpty && s.circuit == nil && s.cache == nil
        {
            // The usual end of a line, with none of the fields that only some lines have.
            json.fields(#""retries":[],"retry_stopped":null,"validation":null,"outcome":"ok","error":null"#)
        } else {
            if usualRetries {
                json.fields(#""retries":[],"retry_stopped":null,"validation":null"#)
            } else {
                retryFields(s, into: &json)
            }
            occasionalFields(s, into: &json)
            if s.outcome == .ok && s.error == nil {
                json.fields(#""outcome":"ok","error":null"#)
            } else {
                json.field("outcome", s.outcome.rawValue)
                if let error = s.error { json.field("error", error) } else { json.null("error") }
            }
        }
        // A call that succeeded and left no `ctx.vars` has nothing for the line: its outcome
        // and duration are the metrics' (`sluice_lua_calls_total`, the duration histogram).
        if let lua = s.lua, lua.isLogged { json.object("lua") { Self.write(lua, into: &$0) } }
    }

    /// The fields only some lines have, between the retries' and the outcome: `trust_failure`,
    /// `rate_limit`, `insecure`, `resumed` and `resumed_at`, `circuit`, `cache`.
    private func occasionalFields(_ s: ExchangeSummary, into json: inout JSONLine) {
        if let failure = s.trustFailure {
            json.raw(
                "trust_failure",
                "{\"evaluator\":\(JSONLine.quoted(failure.evaluator)),\"reason\":\(JSONLine.quoted(failure.reason))}")
        }
        if let limit = s.rateLimit {
            if limit == .allowed {
                json.raw("rate_limit", #"{"decision":"allowed","waited_ms":0}"# as StaticString)
            } else {
                var text = #"{"decision":""# + limit.decision.rawValue + #"","waited_ms":"#
                text += String(limit.waitedMilliseconds)
                if !limit.limit.isEmpty { text += #","limit":"# + JSONLine.quoted(limit.limit) }
                json.raw("rate_limit", text + "}")
            }
        }
        if s.insecure { json.raw("insecure", "true" as StaticString) }
        if !s.resumedAt.isEmpty {
            json.raw("resumed", String(s.resumedAt.count))
            json.raw("resumed_at", "[" + s.resumedAt.map(String.init).joined(separator: ",") + "]")
        }
        if let circuit = s.circuit { json.field("circuit", circuit) }
        if let cache = s.cache { json.field("cache", cache) }
    }

    /// `retries`, `retry_stopped` and `validation`, when one of them is not at its usual value.
    private func retryFields(_ s: ExchangeSummary, into json: inout JSONLine) {
        if s.retries.isEmpty {
            json.raw("retries", "[]" as StaticString)
        } else {
            json.raw(
                "retries",
                "["
                    + s.retries.map {
                        "{\"attempt\":\($0.attempt),\"delay_ms\":\($0.delayMilliseconds),\"reason\":\(JSONLine.quoted($0.reason))}"
                    }.joined(separator: ",") + "]")
        }
        if let stopped = s.retryStopped {
            json.field("retry_stopped", stopped.rawValue)
        } else {
            json.null("retry_stopped")
        }
        if let validation = s.validation { json.field("validation", validation) } else { json.null("validation") }
    }

    /// The access log's `lua` object: `{script, hook, outcome, error, us, instructions, memory, vars}`.
    static func write(_ call: LuaCallRecord, into json: inout JSONLine) {
        json.field("script", call.script)
        switch call.hook {
        case "on_request": json.raw("hook", #""on_request""# as StaticString)
        case "on_response": json.raw("hook", #""on_response""# as StaticString)
        case "on_log": json.raw("hook", #""on_log""# as StaticString)
        default: json.field("hook", call.hook)
        }
        switch call.outcome {
        case "ok": json.raw("outcome", #""ok""# as StaticString)
        default: json.field("outcome", call.outcome)
        }
        if let error = call.error { json.field("error", error) } else { json.raw("error", "null" as StaticString) }
        json.field("us", call.microseconds)
        json.field("instructions", call.instructions)
        json.field("memory", call.memory)
        if call.vars.isEmpty {
            json.raw("vars", "{}" as StaticString)
        } else {
            json.raw("vars", Self.json(.table(call.vars)))
        }
    }

    private static func json(_ value: LuaValue) -> String {
        switch value {
        case .bool(let b): return b ? "true" : "false"
        case .integer(let i): return String(i)
        case .number(let d): return d.isFinite ? String(d) : "null"
        case .string(let text): return JSONLine.quoted(text)
        case .array(let items): return "[" + items.map(json).joined(separator: ",") + "]"
        case .table(let fields):
            return "{" + fields.keys.sorted().map { JSONLine.quoted($0) + ":" + json(fields[$0]!) }.joined(separator: ",")
                + "}"
        }
    }

}

extension LuaCallRecord {
    /// The record as the access log's `lua` object (`sluice lua test` prints it).
    public var json: String {
        var line = JSONLine()
        AccessLogMonitor.write(self, into: &line)
        var text = line.finish()
        if text.hasSuffix("\n") { text.removeLast() }
        return text
    }
}

extension UpstreamHTTPVersion {
    /// The access log's `upstream_protocol` field, whole, as a literal.
    var accessLogField: StaticString {
        switch self {
        case .http1_0: #""upstream_protocol":"HTTP/1.0""#
        case .http1_1: #""upstream_protocol":"HTTP/1.1""#
        case .http2: #""upstream_protocol":"HTTP/2""#
        }
    }
}

extension UpstreamEngine {
    /// The access log's `upstream_engine` field, whole, as a literal.
    var accessLogField: StaticString {
        switch self {
        case .native: #""upstream_engine":"native""#
        case .curl: #""upstream_engine":"curl""#
        }
    }
}

/// A monitor that writes lines to a `LogSink`, one instance per worker.
public protocol LogMonitor: EventMonitor {
    /// The YAML name (`access_log`, `debug`).
    static var kind: String { get }
    init(sink: LogSink, redactor: Redactor)
}

/// Makes a `LogMonitor` per worker, all writing to one sink.
public struct LogMonitorFactory<Monitor: LogMonitor>: EventMonitorFactory {
    public let sink: LogSink
    public let redactor: Redactor
    public var summary: String { "\(Monitor.kind) (\(sink.path))" }
    public init(sink: LogSink, redactor: Redactor) {
        self.sink = sink
        self.redactor = redactor
    }
    public func makeMonitor() -> any EventMonitor { Monitor(sink: sink, redactor: redactor) }
}

/// The `debug` monitor: per upstream try, a `curl` command that reproduces it, with
/// credentials and secrets redacted (unlike Alamofire's `cURLDescription`).
public final class DebugMonitor: LogMonitor {
    public static let kind = "debug"
    public var wantsRequestDetails: Bool { true }
    private let buffer: LogSink.Buffer
    private let redactor: Redactor

    public init(sink: LogSink, redactor: Redactor) {
        buffer = sink.makeBuffer()
        self.redactor = redactor
    }

    public var events: ProxyEvent.Kinds { .tryStarted }
    public var readsEveryScriptCall: Bool { false }

    public func handle(_ event: ProxyEvent) {
        guard case .tryStarted(let id, let attempt, let request) = event else { return }
        var line = "debug \(id) try \(attempt): curl -X \(request.method)"
        for field in request.headerFields {
            let value = redactor.headerValue(name: field.name.canonicalName, value: field.value)
            line += " -H " + shellQuoted("\(field.name.rawName): \(value)")
        }
        if request.body != .none { line += " --data-binary @-" }
        line += " " + shellQuoted(redactor.url(request.url)) + "\n"
        buffer.append(redactor.scrub(line))
    }

    private func shellQuoted(_ s: String) -> String {
        "'" + s.replacing("'", with: "'\\''") + "'"
    }
}

/// Builds one JSON object on one line, escaping strings per RFC 8259, as bytes (every
/// finished request formats one).
/// The bytes a `JSONLine` is written into: one capacity check per field, then stores through
/// a pointer (an access-log line is some 25 fields; appending each piece to an `Array` cost
/// a uniqueness and a capacity check per byte run). A monitor keeps one and reuses it, so a
/// line costs no allocation.
///
/// Threading: used by one thread at a time (a worker's monitor, or a single log call).
final class JSONBuffer {
    fileprivate private(set) var base: UnsafeMutablePointer<UInt8>
    fileprivate private(set) var capacity: Int
    fileprivate var count = 0

    init(capacity: Int = 1024) {
        self.capacity = capacity
        base = .allocate(capacity: capacity)
    }

    deinit { base.deallocate() }

    /// Room for `extra` more bytes.
    @inline(__always)
    fileprivate func reserve(_ extra: Int) {
        if count + extra > capacity { grow(count + extra) }
    }

    private func grow(_ needed: Int) {
        let newCapacity = max(needed, capacity * 2)
        let newBase = UnsafeMutablePointer<UInt8>.allocate(capacity: newCapacity)
        newBase.update(from: base, count: count)
        base.deallocate()
        base = newBase
        capacity = newCapacity
    }

    @inline(__always)
    fileprivate func put(_ b: UInt8) {
        base[count] = b
        count += 1
    }

    @inline(__always)
    fileprivate func put(_ bytes: UnsafePointer<UInt8>, _ n: Int) {
        ShortCopy.copy(base + count, bytes, n)
        count += n
    }

    /// The bytes written so far (valid until the next write).
    var bytes: UnsafeBufferPointer<UInt8> { UnsafeBufferPointer(start: base, count: count) }
}

/// A field whose value mostly repeats from line to line (a worker's lines share a few
/// policies): the bytes `JSONLine.field(_:_:repeating:)` wrote for it last, and the value
/// they are for.
///
/// Threading: owned with its monitor, by the worker whose lines it writes.
struct RepeatedField {
    fileprivate var value: String?
    fileprivate var bytes: [UInt8] = []
}

/// One JSON object on one line, written field by field into a `JSONBuffer`.
struct JSONLine {
    private let buffer: JSONBuffer
    private var first = true

    init() { self.init(reusing: JSONBuffer(capacity: 512)) }

    /// Writes into `buffer` (emptied), keeping its capacity.
    init(reusing buffer: JSONBuffer) {
        self.buffer = buffer
        buffer.count = 0
        buffer.reserve(1)
        buffer.put(0x7B)  // {
    }

    /// `"k":"2026-11-22T00:41:07.123Z"`, the current time, without a String.
    mutating func timestamp(_ k: StaticString) {
        key(k)
        buffer.reserve(Timestamp.length + 2)
        buffer.put(0x22)
        buffer.count += Timestamp.writeRFC3339Now(to: buffer.base + buffer.count)
        buffer.put(0x22)
    }

    /// `"k":{…}`: `fields` writes the inner object's fields through a line on the same buffer.
    mutating func object(_ k: StaticString, _ fields: (inout JSONLine) -> Void) {
        key(k)
        var inner = JSONLine(nestedIn: buffer)
        fields(&inner)
        buffer.reserve(1)
        buffer.put(0x7D)
    }

    /// An object inside another's buffer: opens it, without emptying what was written.
    private init(nestedIn buffer: JSONBuffer) {
        self.buffer = buffer
        buffer.reserve(1)
        buffer.put(0x7B)
    }

    /// `"k":{"dns":…,"connect":…,"tls":…,"first_byte":…,"total":…}` in milliseconds.
    mutating func timings(_ k: StaticString, _ t: TryTimings) {
        key(k)
        if t.dns == 0 && t.connect == 0 && t.tls == 0 {
            // A reused connection (most tries): the three zeros and the next key as one literal.
            milliseconds(#"{"dns":0.000,"connect":0.000,"tls":0.000,"first_byte":"#, t.firstByte)
        } else {
            milliseconds(#"{"dns":"#, t.dns)
            milliseconds(#","connect":"#, t.connect)
            milliseconds(#","tls":"#, t.tls)
            milliseconds(#","first_byte":"#, t.firstByte)
        }
        milliseconds(#","total":"#, t.total)
        buffer.reserve(1)
        buffer.put(0x7D)
    }

    /// `prefix` (the punctuation and key before the value, as one literal), then `us` as
    /// milliseconds with three decimals (`0.187`, `12345.678`).
    private mutating func milliseconds(_ prefix: StaticString, _ us: Int64) {
        buffer.reserve(prefix.utf8CodeUnitCount + 25)
        buffer.put(prefix.utf8Start, prefix.utf8CodeUnitCount)
        let whole = us / 1000
        // Under 10 ms (most phases of most tries): one digit, without `appendInteger`'s loops.
        if whole >= 0 && whole < 10 {
            buffer.put(UInt8(truncatingIfNeeded: 48 + whole))
        } else {
            appendInteger(whole)
        }
        let frac = Int(abs(us % 1000))
        buffer.put(0x2E)
        buffer.put(UInt8(48 + frac / 100))
        buffer.put(UInt8(48 + frac / 10 % 10))
        buffer.put(UInt8(48 + frac % 10))
    }

    /// Keys are literals: written as their bytes, no `String` touched.
    private mutating func key(_ k: StaticString) {
        buffer.reserve(k.utf8CodeUnitCount + 4)
        if !first { buffer.put(0x2C) }
        first = false
        buffer.put(0x22)
        buffer.put(k.utf8Start, k.utf8CodeUnitCount)
        buffer.put(0x22)
        buffer.put(0x3A)
    }

    mutating func field(_ k: StaticString, _ v: String) {
        key(k)
        Self.writeQuoted(v, to: buffer)
    }

    /// `"k":` as one literal (`run`, the key quoted with its colon; the comma before it comes
    /// from `fields`), then `v` quoted: one copy for the key where `field` writes it in five
    /// steps.
    mutating func string(_ run: StaticString, _ v: String) {
        fields(run)
        Self.writeQuoted(v, to: buffer)
    }

    /// `"k":` as one literal (`run`, after the comma `fields` writes), then the decimal `v`.
    mutating func integer<I: BinaryInteger>(_ run: StaticString, _ v: I) {
        fields(run)
        appendInteger(v)
    }

    /// Whole fields from a literal (`"method":"GET"`, `"retries":[],"retry_stopped":null`),
    /// without the comma before them: one copy where `key` and a value take several steps.
    mutating func fields(_ run: StaticString) {
        fields(UnsafeBufferPointer(start: run.utf8Start, count: run.utf8CodeUnitCount))
    }

    private mutating func fields(_ run: UnsafeBufferPointer<UInt8>) {
        buffer.reserve(run.count + 1)
        if !first { buffer.put(0x2C) }
        first = false
        if let source = run.baseAddress { buffer.put(source, run.count) }
    }

    /// `"k":"v"`, copied whole from `memo` when `v` is the value it holds (one copy, no escape
    /// scan); otherwise written, and kept in `memo` for the next line.
    mutating func field(_ k: StaticString, _ v: String, repeating memo: inout RepeatedField) {
        // Compared as UTF-8 bytes: `==` on strings is canonical equivalence, and two names
        // that differ only in normalization must not share bytes.
        if let held = memo.value, Self.sameBytes(held, v) {
            memo.bytes.withUnsafeBufferPointer { fields($0) }
            return
        }
        key(k)
        let start = buffer.count - k.utf8CodeUnitCount - 3  // the key's opening quote
        Self.writeQuoted(v, to: buffer)
        memo.value = v
        memo.bytes.removeAll(keepingCapacity: true)
        memo.bytes.append(contentsOf: UnsafeBufferPointer(start: buffer.base + start, count: buffer.count - start))
    }

    /// Whether two strings hold the same UTF-8 bytes: one `memcmp` of their storage (the
    /// generic `elementsEqual` of two UTF-8 views cost some 80 instructions a byte).
    static func sameBytes(_ a: String, _ b: String) -> Bool {
        guard a.utf8.count == b.utf8.count else { return false }
        var a = a
        var b = b
        return a.withUTF8 { x in b.withUTF8 { y in x.count == 0 || memcmp(x.baseAddress!, y.baseAddress!, x.count) == 0 } }
    }

    /// A field whose key is not a literal (a diagnostic's metadata).
    mutating func field(named k: String, _ v: String) {
        buffer.reserve(1)
        if !first { buffer.put(0x2C) }
        first = false
        Self.writeQuoted(k, to: buffer)
        buffer.reserve(1)
        buffer.put(0x3A)
        Self.writeQuoted(v, to: buffer)
    }

    static func quoted(_ v: String) -> String {
        let buffer = JSONBuffer(capacity: v.utf8.count + 16)
        writeQuoted(v, to: buffer)
        return String(decoding: buffer.bytes, as: UTF8.self)
    }

    /// `v` as a JSON string: runs that need no escape are copied whole (a URL, a method: all
    /// of it); `"`, `\`, controls and DEL are escaped; other UTF-8 passes through (RFC 8259).
    private static func writeQuoted(_ v: String, to buffer: JSONBuffer) {
        var v = v
        v.withUTF8 { bytes in
            // Escapes are at most 6 bytes for 1: reserved up front, no check per byte.
            buffer.reserve(bytes.count * 6 + 2)
            buffer.put(0x22)
            guard let source = bytes.baseAddress else {
                buffer.put(0x22)
                return
            }
            var run = 0
            var i = 0
            while i < bytes.count {
                // Eight bytes at a time while none needs an escape (most values need none).
                if i + 8 <= bytes.count,
                    !Self.needsEscape(UnsafeRawPointer(source + i).loadUnaligned(as: UInt64.self))
                {
                    i += 8
                    continue
                }
                // The tail of a value of eight bytes or more: the last eight bytes, overlapping
                // ones already seen; clean, they end the value without the byte loop.
                if i + 8 > bytes.count, bytes.count >= 8,
                    !Self.needsEscape(UnsafeRawPointer(source + bytes.count - 8).loadUnaligned(as: UInt64.self))
                {
                    break
                }
                let end = min(i + 8, bytes.count)
                for i in i..<end {
                    let b = bytes[i]
                    guard b < 0x20 || b == 0x22 || b == 0x5C || b == 0x7F else { continue }
                    buffer.put(source + run, i - run)
                    run = i + 1
                    buffer.put(0x5C)
                    switch b {
                    case 0x22: buffer.put(0x22)
                    case 0x5C: buffer.put(0x5C)
                    case 0x0A: buffer.put(0x6E)
                    case 0x0D: buffer.put(0x72)
                    case 0x09: buffer.put(0x74)
                    default:
                        let hex: StaticString = "0123456789abcdef"
                        buffer.put(0x75)
                        buffer.put(0x30)
                        buffer.put(0x30)
                        buffer.put(hex.utf8Start[Int(b >> 4)])
                        buffer.put(hex.utf8Start[Int(b & 0xF)])
                    }
                }
                i = end
            }
            buffer.put(source + run, bytes.count - run)
            buffer.put(0x22)
        }
    }

    /// Whether any of the eight bytes in `word` is a control byte, `"`, `\\` or DEL (`SWAR`;
    /// a match only sends the word to the byte loop). Bytes of 0x80 and above never match.
    @inline(__always)
    static func needsEscape(_ word: UInt64) -> Bool {
        SWAR.controlOrDEL(word) | SWAR.equal(0x22, word) | SWAR.equal(0x5C, word) != 0
    }

    mutating func field<I: BinaryInteger>(_ k: StaticString, _ v: I) {
        key(k)
        appendInteger(v)
    }

    mutating func raw(_ k: StaticString, _ json: String) {
        key(k)
        var json = json
        json.withUTF8 { bytes in
            buffer.reserve(bytes.count)
            if let source = bytes.baseAddress { buffer.put(source, bytes.count) }
        }
    }

    /// `"k":null`. (A literal passed to `raw` is a `String` unless written `as StaticString`,
    /// and the `String` form costs a copy and twice the instructions.)
    mutating func null(_ k: StaticString) {
        raw(k, "null" as StaticString)
    }

    mutating func raw(_ k: StaticString, _ json: StaticString) {
        key(k)
        buffer.reserve(json.utf8CodeUnitCount)
        buffer.put(json.utf8Start, json.utf8CodeUnitCount)
    }

    private mutating func appendInteger<I: BinaryInteger>(_ v: I) {
        buffer.reserve(21)
        if v < 0 {
            buffer.put(0x2D)  // -
            writeDigits(UInt64(v.magnitude))
        } else if v < 10 {
            // A zero byte count, one attempt: one digit, without the digit count's loop.
            buffer.put(UInt8(truncatingIfNeeded: 48 + Int(truncatingIfNeeded: v)))
        } else if v >= 100 && v < 1000 {
            // A status code.
            let n = Int(truncatingIfNeeded: v)
            buffer.put(UInt8(truncatingIfNeeded: 48 + n / 100))
            buffer.put(UInt8(truncatingIfNeeded: 48 + n / 10 % 10))
            buffer.put(UInt8(truncatingIfNeeded: 48 + n % 10))
        } else {
            writeDigits(UInt64(v))
        }
    }

    /// The decimal digits of `n`, written in place (at most 20).
    private func writeDigits(_ n: UInt64) {
        var digits = 1
        var rest = n / 10
        while rest > 0 {
            digits += 1
            rest /= 10
        }
        var n = n
        let out = buffer.base + buffer.count
        for i in stride(from: digits - 1, through: 0, by: -1) {
            out[i] = UInt8(48 + n % 10)
            n /= 10
        }
        buffer.count += digits
    }

    mutating func finish() -> String {
        String(decoding: finishLine(), as: UTF8.self)
    }

    mutating func finishBytes() -> [UInt8] {
        Array(finishLine())
    }

    /// Closes the object and ends the line; the bytes stay valid until the buffer is reused.
    mutating func finishLine() -> UnsafeBufferPointer<UInt8> {
        buffer.reserve(2)
        buffer.put(0x7D)
        buffer.put(0x0A)
        return buffer.bytes
    }
}

enum Timestamp {
    /// The formatted second, per thread (each worker formats its own lines).
    private final class Cache {
        var second = -1
        var prefixBytes: [UInt8] = []
    }
    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        pthread_key_create(&key) { Unmanaged<AnyObject>.fromOpaque($0!).release() }
        return key
    }()

    private static var cache: Cache {
        if let raw = pthread_getspecific(key) { return Unmanaged<Cache>.fromOpaque(raw).takeUnretainedValue() }
        let cache = Cache()
        pthread_setspecific(key, Unmanaged.passRetained(cache).toOpaque())
        return cache
    }

    /// The most `writeRFC3339Now` writes (24 bytes until the year 10000).
    static let length = 32

    /// Writes `2026-11-22T00:41:07.123Z` at `out` (room for `length` bytes); returns the
    /// count written. The date and time part is formatted once per second.
    static func writeRFC3339Now(to out: UnsafeMutablePointer<UInt8>) -> Int {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        let cache = Self.cache
        if cache.second != ts.tv_sec { refresh(cache, ts.tv_sec) }
        let prefix = cache.prefixBytes.count
        cache.prefixBytes.withUnsafeBufferPointer { out.update(from: $0.baseAddress!, count: prefix) }
        let ms = Int(ts.tv_nsec / 1_000_000)
        out[prefix] = UInt8(48 + ms / 100)
        out[prefix + 1] = UInt8(48 + ms / 10 % 10)
        out[prefix + 2] = UInt8(48 + ms % 10)
        out[prefix + 3] = 0x5A
        return prefix + 4
    }

    private static func refresh(_ cache: Cache, _ second: Int) {
        var t = time_t(second)
        var tm = Glibc.tm()
        gmtime_r(&t, &tm)
        cache.second = second
        let prefix =
            "\(pad(tm.tm_year + 1900, 4))-\(pad(tm.tm_mon + 1))-\(pad(tm.tm_mday))T"
            + "\(pad(tm.tm_hour)):\(pad(tm.tm_min)):\(pad(tm.tm_sec))."
        cache.prefixBytes = Array(prefix.utf8)
    }

    private static func pad(_ v: Int32, _ width: Int = 2) -> String {
        let s = String(v)
        return s.count >= width ? s : String(repeating: "0", count: width - s.count) + s
    }
}

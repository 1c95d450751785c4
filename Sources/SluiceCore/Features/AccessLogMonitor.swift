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
    /// The last line's bytes, kept for their capacity: one line costs no allocation.
    private var spare: [UInt8] = []

    public init(sink: LogSink, redactor: Redactor) {
        buffer = sink.makeBuffer()
        self.redactor = redactor
    }

    public var events: ProxyEvent.Kinds { [.finished, .tunnelClosed, .credentialRefreshed, .credentialRefreshFailed] }

    public func handle(_ event: ProxyEvent) {
        switch event {
        case .finished(let summary), .tunnelClosed(let summary):
            var json = JSONLine(reusing: spare)
            spare = []
            let line = redactor.scrub(bytes: lineBytes(summary, into: &json))
            buffer.append(bytes: line)
            spare = line
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

    /// One access-log line, before the final scrub.
    private func lineBytes(_ s: ExchangeSummary, into json: inout JSONLine) -> [UInt8] {
        json.timestamp("time")
        json.field("id", s.id)
        json.field("client", s.client)
        if let user = s.user { json.field("user", user) } else { json.raw("user", "null") }
        if let requestId = s.requestId { json.field("request_id", requestId) }
        json.field("method", s.method)
        json.field("url", redactor.urlWithoutScrub(s.url))
        json.field("policy", s.policy)
        json.field("status", s.status)
        json.field("bytes_in", s.bytesIn)
        json.field("bytes_out", s.bytesOut)
        json.field("attempts", s.attempts)
        json.field("redirects", s.redirects)
        if let t = s.timings {
            json.timings("timings", t)
            if let version = t.httpVersion {
                json.field("upstream_protocol", version.rawValue)
                json.raw("upstream_connection", t.newConnection ? "\"new\"" as StaticString : "\"reused\"")
                if let engine = t.engine { json.field("upstream_engine", engine.rawValue) } else { json.raw("upstream_engine", "null") }
            } else {
                json.raw("upstream_protocol", "null")
                json.raw("upstream_connection", "null")
                json.raw("upstream_engine", "null")
            }
        } else {
            json.raw("timings", "null")
        }
        if s.retries.isEmpty {
            json.raw("retries", "[]")
        } else {
            json.raw("retries", "[" + s.retries.map {
                "{\"attempt\":\($0.attempt),\"delay_ms\":\($0.delayMilliseconds),\"reason\":\(JSONLine.quoted($0.reason))}"
            }.joined(separator: ",") + "]")
        }
        if let stopped = s.retryStopped { json.field("retry_stopped", stopped.rawValue) } else { json.raw("retry_stopped", "null") }
        if let validation = s.validation { json.field("validation", validation) } else { json.raw("validation", "null") }
        if let failure = s.trustFailure {
            json.raw("trust_failure", "{\"evaluator\":\(JSONLine.quoted(failure.evaluator)),\"reason\":\(JSONLine.quoted(failure.reason))}")
        }
        if s.insecure { json.raw("insecure", "true") }
        if let circuit = s.circuit { json.field("circuit", circuit) }
        if let cache = s.cache { json.field("cache", cache) }
        json.field("outcome", s.outcome.rawValue)
        if let error = s.error { json.field("error", error) } else { json.raw("error", "null") }
        return json.finishBytes()  // scrubbed once, as a whole, by the caller
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
struct JSONLine {
    private var out: [UInt8] = [0x7B]  // {
    private var first = true

    init() { out.reserveCapacity(512) }

    /// Writes into `buffer`'s storage (emptied), keeping its capacity.
    init(reusing buffer: [UInt8]) {
        out = buffer
        out.removeAll(keepingCapacity: true)
        if out.capacity < 512 { out.reserveCapacity(512) }
        out.append(0x7B)
    }

    /// `"k":"2026-11-22T00:41:07.123Z"`, the current time, without a String.
    mutating func timestamp(_ k: StaticString) {
        key(k)
        out.append(0x22)
        Timestamp.appendRFC3339Now(to: &out)
        out.append(0x22)
    }

    /// `"k":{"dns":…,"connect":…,"tls":…,"first_byte":…,"total":…}` in milliseconds.
    mutating func timings(_ k: StaticString, _ t: TryTimings) {
        key(k)
        out.append(0x7B)
        millisecondsField("dns", t.dns, first: true)
        millisecondsField("connect", t.connect)
        millisecondsField("tls", t.tls)
        millisecondsField("first_byte", t.firstByte)
        millisecondsField("total", t.total)
        out.append(0x7D)
    }

    private mutating func millisecondsField(_ name: StaticString, _ us: Int64, first: Bool = false) {
        if !first { out.append(0x2C) }
        out.append(0x22)
        out.append(contentsOf: UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount))
        out.append(0x22)
        out.append(0x3A)
        appendInteger(us / 1000)
        let frac = Int(us % 1000)
        out.append(0x2E)
        out.append(UInt8(48 + frac / 100))
        out.append(UInt8(48 + frac / 10 % 10))
        out.append(UInt8(48 + frac % 10))
    }

    /// Keys are literals: appended as their bytes, no `String` touched.
    private mutating func key(_ k: StaticString) {
        if !first { out.append(0x2C) }
        first = false
        out.append(0x22)
        out.append(contentsOf: UnsafeBufferPointer(start: k.utf8Start, count: k.utf8CodeUnitCount))
        out.append(0x22)
        out.append(0x3A)
    }

    mutating func field(_ k: StaticString, _ v: String) {
        key(k)
        Self.appendQuoted(v, to: &out)
    }

    /// A field whose key is not a literal (a diagnostic's metadata).
    mutating func field(named k: String, _ v: String) {
        if !first { out.append(0x2C) }
        first = false
        Self.appendQuoted(k, to: &out)
        out.append(0x3A)
        Self.appendQuoted(v, to: &out)
    }

    static func quoted(_ v: String) -> String {
        var bytes: [UInt8] = []
        appendQuoted(v, to: &bytes)
        return String(decoding: bytes, as: UTF8.self)
    }

    static func appendQuoted(_ v: String, to out: inout [UInt8]) {
        var v = v
        out.append(0x22)
        v.withUTF8 { bytes in
            // Runs that need no escape are appended whole (a URL, a method: all of it).
            var run = 0
            for i in 0..<bytes.count {
                let b = bytes[i]
                guard b < 0x20 || b == 0x22 || b == 0x5C || b == 0x7F else { continue }
                out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[run..<i]))
                run = i + 1
                out.append(0x5C)
                switch b {
                case 0x22: out.append(0x22)
                case 0x5C: out.append(0x5C)
                case 0x0A: out.append(0x6E)
                case 0x0D: out.append(0x72)
                case 0x09: out.append(0x74)
                default:
                    let hex: StaticString = "0123456789abcdef"
                    out.append(0x75); out.append(0x30); out.append(0x30)
                    out.append(hex.utf8Start[Int(b >> 4)])
                    out.append(hex.utf8Start[Int(b & 0xF)])
                }
            }
            out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[run...]))  // UTF-8 passes through (RFC 8259)
        }
        out.append(0x22)
    }

    mutating func field<I: BinaryInteger>(_ k: StaticString, _ v: I) {
        key(k)
        appendInteger(v)
    }

    mutating func raw(_ k: StaticString, _ json: String) {
        key(k)
        out.append(contentsOf: json.utf8)
    }

    mutating func raw(_ k: StaticString, _ json: StaticString) {
        key(k)
        out.append(contentsOf: UnsafeBufferPointer(start: json.utf8Start, count: json.utf8CodeUnitCount))
    }

    private mutating func appendInteger<I: BinaryInteger>(_ v: I) {
        if v < 0 {
            out.append(contentsOf: String(v).utf8)
            return
        }
        var digits: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8,
                     UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) =
            (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        var n = UInt64(v)
        var count = 0
        withUnsafeMutableBytes(of: &digits) { d in
            repeat {
                d[19 - count] = UInt8(48 + n % 10)
                n /= 10
                count += 1
            } while n > 0
            out.append(contentsOf: d[(20 - count)...])
        }
    }

    mutating func finish() -> String {
        String(decoding: finishBytes(), as: UTF8.self)
    }

    mutating func finishBytes() -> [UInt8] {
        out.append(0x7D)
        out.append(0x0A)
        return out
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

    /// `2026-11-22T00:41:07.123Z`, appended; the date and time part is formatted once per second.
    static func appendRFC3339Now(to out: inout [UInt8]) {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        let cache = Self.cache
        if cache.second != ts.tv_sec { refresh(cache, ts.tv_sec) }
        out.append(contentsOf: cache.prefixBytes)
        let ms = Int(ts.tv_nsec / 1_000_000)
        out.append(UInt8(48 + ms / 100))
        out.append(UInt8(48 + ms / 10 % 10))
        out.append(UInt8(48 + ms % 10))
        out.append(0x5A)
    }

    private static func refresh(_ cache: Cache, _ second: Int) {
        var t = time_t(second)
        var tm = Glibc.tm()
        gmtime_r(&t, &tm)
        cache.second = second
        let prefix = "\(pad(tm.tm_year + 1900, 4))-\(pad(tm.tm_mon + 1))-\(pad(tm.tm_mday))T"
            + "\(pad(tm.tm_hour)):\(pad(tm.tm_min)):\(pad(tm.tm_sec))."
        cache.prefixBytes = Array(prefix.utf8)
    }

    private static func pad(_ v: Int32, _ width: Int = 2) -> String {
        let s = String(v)
        return s.count >= width ? s : String(repeating: "0", count: width - s.count) + s
    }
}

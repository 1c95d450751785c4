import Foundation
import Testing

@testable import SluiceCore

/// The access log writes its usual values as literal runs (`"method":"GET"`,
/// `"retries":[],"retry_stopped":null,"validation":null`) and copies a repeated policy's
/// field whole: each line must still be byte for byte the one the plain field-by-field form
/// gives, whichever values take the literal path and whichever do not.
@Suite struct AccessLogMonitorTests {
    /// The lines `events` make, without their `time` field (the clock's).
    private func lines(_ events: [ProxyEvent], redactor: Redactor = Redactor()) throws -> [String] {
        let path = FileManager.default.temporaryDirectory
            .appendingPathComponent("sluice-access-\(UInt64.random(in: 0 ... .max)).log").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let sink = try LogSink.shared(path: path)
        let monitor = AccessLogMonitor(sink: sink, redactor: redactor)
        for event in events { monitor.handle(event) }
        sink.flush()
        let text = try String(contentsOfFile: path, encoding: .utf8)
        return try text.split(separator: "\n", omittingEmptySubsequences: false).dropLast().map { (line: Substring) -> String in
            let time = try #require(line.firstRange(of: #"{"time":""#))
            #expect(time.lowerBound == line.startIndex)
            let rest = line[time.upperBound...].drop { $0 != "," }
            return "{" + rest.dropFirst() + "\n"
        }
    }

    /// The line for `s` without `time`, written plainly field after field in the documented
    /// order (the reference the literal runs must match).
    private func plainLine(_ s: ExchangeSummary) -> String {
        func q(_ v: String) -> String { JSONLine.quoted(v) }
        func ms(_ us: Int64) -> String { "\(us / 1000)." + String(String(us % 1000 + 1000).dropFirst()) }
        var f: [String] = ["\"id\":\(s.id)", "\"client\":\(q(s.client))", "\"user\":\(s.user.map(q) ?? "null")"]
        if let id = s.requestId { f.append("\"request_id\":\(q(id))") }
        f += ["\"method\":\(q(s.method))", "\"url\":\(q(s.url))", "\"policy\":\(q(s.policy))", "\"status\":\(s.status)"]
        f += ["\"bytes_in\":\(s.bytesIn)", "\"bytes_out\":\(s.bytesOut)", "\"attempts\":\(s.attempts)"]
        f.append("\"redirects\":\(s.redirects)")
        if let t = s.timings {
            f.append(
                "\"timings\":{\"dns\":\(ms(t.dns)),\"connect\":\(ms(t.connect)),\"tls\":\(ms(t.tls)),"
                    + "\"first_byte\":\(ms(t.firstByte)),\"total\":\(ms(t.total))}")
            if let version = t.httpVersion {
                f.append("\"upstream_protocol\":\(q(version.rawValue))")
                f.append("\"upstream_connection\":\(t.newConnection ? "\"new\"" : "\"reused\"")")
                f.append("\"upstream_engine\":\(t.engine.map { q($0.rawValue) } ?? "null")")
            } else {
                f += ["\"upstream_protocol\":null", "\"upstream_connection\":null", "\"upstream_engine\":null"]
            }
        } else {
            f.append("\"timings\":null")
        }
        let retries = s.retries.map {
            "{\"attempt\":\($0.attempt),\"delay_ms\":\($0.delayMilliseconds),\"reason\":\(q($0.reason))}"
        }
        f.append("\"retries\":[\(retries.joined(separator: ","))]")
        f.append("\"retry_stopped\":\(s.retryStopped.map { q($0.rawValue) } ?? "null")")
        f.append("\"validation\":\(s.validation.map(q) ?? "null")")
        if let failure = s.trustFailure {
            f.append("\"trust_failure\":{\"evaluator\":\(q(failure.evaluator)),\"reason\":\(q(failure.reason))}")
        }
        if let limit = s.rateLimit {
            var text = "\"rate_limit\":{\"decision\":\(q(limit.decision.rawValue)),\"waited_ms\":\(limit.waitedMilliseconds)"
            if !limit.limit.isEmpty { text += ",\"limit\":\(q(limit.limit))" }
            f.append(text + "}")
        }
        if s.insecure { f.append("\"insecure\":true") }
        if !s.resumedAt.isEmpty {
            f.append("\"resumed\":\(s.resumedAt.count)")
            f.append("\"resumed_at\":[\(s.resumedAt.map(String.init).joined(separator: ","))]")
        }
        if let circuit = s.circuit { f.append("\"circuit\":\(q(circuit))") }
        if let cache = s.cache { f.append("\"cache\":\(q(cache))") }
        f.append("\"outcome\":\(q(s.outcome.rawValue))")
        f.append("\"error\":\(s.error.map(q) ?? "null")")
        return "{" + f.joined(separator: ",") + "}\n"
    }

    private func summary(method: String = "GET", policy: String = "default") -> ExchangeSummary {
        var s = ExchangeSummary(id: 7, client: "127.0.0.1:5000", method: method, url: "http://a.test/x?q=1", policy: policy)
        s.status = 200
        s.bytesOut = 1024
        s.attempts = 1
        s.requestId = "r-1"
        var t = TryTimings()
        t.dns = 1
        t.connect = 1_002
        t.firstByte = 187
        t.total = 12_345_678
        t.httpVersion = .http1_1
        t.engine = .native
        s.timings = t
        return s
    }

    @Test func theUsualLineIsByteForByteThePlainOne() throws {
        let s = summary()
        let line = try #require(try lines([.finished(s)]).first)
        #expect(line == plainLine(s))
        #expect(
            line
                == #"{"id":7,"client":"127.0.0.1:5000","user":null,"request_id":"r-1","method":"GET","url":"http://a.test/x?q=1","#
                + #""policy":"default","status":200,"bytes_in":0,"bytes_out":1024,"attempts":1,"redirects":0,"#
                + #""timings":{"dns":0.001,"connect":1.002,"tls":0.000,"first_byte":0.187,"total":12345.678},"#
                + #""upstream_protocol":"HTTP/1.1","upstream_connection":"reused","upstream_engine":"native","#
                + #""retries":[],"retry_stopped":null,"validation":null,"outcome":"ok","error":null}"# + "\n")
    }

    /// Every value of the fields that have literal runs, and the values beside them, on both
    /// `finished` and `tunnelClosed`.
    @Test func everyLiteralRunAndEveryFallbackMatchThePlainLine() throws {
        var summaries: [ExchangeSummary] = []
        for method in ["GET", "POST", "HEAD", "PUT", "DELETE", "get", "GETS", "M\"X", "PATCH"] {
            summaries.append(summary(method: method))
        }
        for version in UpstreamHTTPVersion.allCases.map(Optional.some) + [nil] {
            for engine in UpstreamEngine.allCases.map(Optional.some) + [nil] {
                for newConnection in [false, true] {
                    var s = summary()
                    s.timings?.httpVersion = version
                    s.timings?.engine = engine
                    s.timings?.newConnection = newConnection
                    summaries.append(s)
                }
            }
        }
        var s = summary()
        s.timings = nil
        s.user = "alice \"a\""
        s.requestId = nil
        summaries.append(s)
        for (attempts, redirects) in [(0, 0), (1, 1), (2, 0), (3, 2)] {
            var s = summary()
            s.attempts = attempts
            s.redirects = redirects
            summaries.append(s)
        }
        for outcome in [Outcome.ok, .error, .clientAborted, .upstreamAborted, .tunnel, .intercepted] {
            for error in [nil, "upstream refused \"h\""] {
                var s = summary()
                s.outcome = outcome
                s.error = error
                summaries.append(s)
            }
        }
        for reason in RetryStopReason.allCases.map(Optional.some) + [nil] {
            for retries in [[], [RetryRecord(attempt: 1, delayMilliseconds: 500, reason: "status 503")]] {
                for validation in [nil, "status 404 is not acceptable"] {
                    var s = summary()
                    s.retryStopped = reason
                    s.retries = retries
                    s.validation = validation
                    summaries.append(s)
                }
            }
        }
        // Each field that only some lines have, alone and with a retry or an error beside it:
        // the usual end of a line is one literal only when none of them is there.
        var occasional: [(inout ExchangeSummary) -> Void] = [
            { $0.trustFailure = (evaluator: "pinned", reason: "no pin \"x\" matched") },
            { $0.rateLimit = .allowed },
            { $0.rateLimit = RateLimitRecord(decision: .waited, waitedMilliseconds: 250, limit: "api") },
            { $0.rateLimit = RateLimitRecord(decision: .rejected) },
            { $0.insecure = true },
            { $0.resumedAt = [1_024, 65_536] },
            { $0.circuit = "half_open" },
            { $0.cache = "hit" },
        ]
        occasional.append {
            $0.cache = "miss"
            $0.circuit = "open"
            $0.insecure = true
        }
        for set in occasional {
            for variant in 0..<3 {
                var s = summary()
                set(&s)
                if variant == 1 { s.retries = [RetryRecord(attempt: 1, delayMilliseconds: 100, reason: "status 502")] }
                if variant == 2 {
                    s.outcome = .error
                    s.error = "upstream refused"
                }
                summaries.append(s)
            }
        }
        // The usual try's literal and every value beside it, with the usual end.
        for bytes in [Int64(0), 7, 10, 99, 100, 999, 1_000, 123_456_789] {
            var s = summary()
            s.bytesIn = bytes
            s.bytesOut = bytes
            s.status = Int(bytes % 1_000)
            summaries.append(s)
        }
        let finished = try lines(summaries.map { .finished($0) })
        let closed = try lines(summaries.map { .tunnelClosed($0) })
        #expect(finished.count == summaries.count && closed == finished)
        for (line, s) in zip(finished, summaries) { #expect(line == plainLine(s)) }
    }

    @Test func theLiteralFieldsSayTheirValuesRawNames() {
        for version in UpstreamHTTPVersion.allCases {
            #expect(version.accessLogField.description == #""upstream_protocol":""# + version.rawValue + "\"")
        }
        for engine in UpstreamEngine.allCases {
            #expect(engine.accessLogField.description == #""upstream_engine":""# + engine.rawValue + "\"")
        }
    }

    /// A policy's field is kept from line to line: it must follow the policy when it changes,
    /// back and forth, with escapes and multi-byte UTF-8, and between names that are equal as
    /// strings but not as bytes (`é` composed, then decomposed).
    @Test func aRepeatedPolicyFollowsEveryChange() throws {
        let policies = [
            "default", "default", "*.corp.internal", "default", "a\"b\\c", "a\"b\\c", "é 漢", "", "", "default",
            "\u{E9}", "e\u{301}", "\u{E9}", "api.long-name.example.com", "api.long-name.example.com", "api.long-name.example.org",
        ]
        let written = try lines(policies.map { .finished(summary(policy: $0)) })
        #expect(written.count == policies.count)
        // As bytes: `==` on strings would take a composed `é` for a decomposed one.
        for (line, policy) in zip(written, policies) {
            #expect(Array(line.utf8) == Array(plainLine(summary(policy: policy)).utf8), "\(policy)")
        }
        #expect(written[4].contains(#","policy":"a\"b\\c","#))
    }

    /// A secret in the finished line is scrubbed there, wherever the literal runs put it.
    @Test func aSecretInTheLineIsScrubbed() throws {
        let redactor = Redactor(secretValues: ["default", "s3cr3t-value"])
        var s = summary()
        s.user = "s3cr3t-value"
        let line = try #require(try lines([.finished(s)], redactor: redactor).first)
        #expect(line.contains(#""user":"<redacted>""#) && line.contains(#""policy":"<redacted>""#))
        #expect(!line.contains("s3cr3t") && !line.contains("default"))
    }
}

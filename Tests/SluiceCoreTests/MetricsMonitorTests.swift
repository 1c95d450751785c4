import Foundation
import Testing

@testable import SluiceCore

/// `SluiceMetrics` (the one declaration of every metric) against docs/metrics.md, and the
/// `metrics` monitor's recording, read back from the Prometheus exposition.
@Suite struct MetricsMonitorTests {
    /// Only a monitor that reads every script call (the metrics; a custom one by default)
    /// makes the scripts' lines path record successful calls without `ctx.vars`.
    @Test func theMetricsAndCustomMonitorsReadEveryScriptCall() throws {
        final class Custom: EventMonitor {
            func handle(_ event: ProxyEvent) {}
        }
        let path = FileManager.default.temporaryDirectory
            .appendingPathComponent("sluice-reads-\(UInt64.random(in: 0 ... .max)).log").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let sink = try LogSink.shared(path: path)
        let log = AccessLogMonitor(sink: sink, redactor: Redactor())
        let debug = DebugMonitor(sink: sink, redactor: Redactor())
        #expect(!log.readsEveryScriptCall && !debug.readsEveryScriptCall)
        #expect(MetricsMonitor().readsEveryScriptCall && Custom().readsEveryScriptCall)
        #expect(!CompositeEventMonitor([log, debug]).readsEveryScriptCall)
        #expect(CompositeEventMonitor([log, MetricsMonitor()]).readsEveryScriptCall)
    }

    @Test func docsListEveryMetricAsDeclared() throws {
        let docs = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .appendingPathComponent("../../docs/metrics.md").standardized
        let text = try String(contentsOf: docs, encoding: .utf8)
        let rows = text.split(separator: "\n").filter { $0.hasPrefix("| `sluice_") }.map { line in
            line.split(separator: "|", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
        }
        let documented = rows.map { row in
            [row[1].replacingOccurrences(of: "`", with: ""), row[2], row[3].replacingOccurrences(of: "`", with: ""), row[4]]
        }
        let declared = SluiceMetrics.catalog.map { [$0.name, $0.kind.rawValue, $0.labels.joined(separator: ", "), $0.help] }
        #expect(documented == declared)
    }

    /// The value of `line` (a metric name with its labels) in the exposition, or 0.
    private func value(_ line: String) -> Double {
        let text = String(decoding: SluiceMetrics.shared.exposition(), as: UTF8.self)
        for row in text.split(separator: "\n") where row.hasPrefix(line + " ") {
            return Double(row.dropFirst(line.count + 1)) ?? .nan
        }
        return 0
    }

    @Test func everyTypeLineHasItsHelpLine() {
        MetricsMonitor().handle(.tunnelOpened(id: 1, client: "c", authority: "h:443"))
        let text = String(decoding: SluiceMetrics.shared.exposition(), as: UTF8.self)
        let lines = text.split(separator: "\n").map(String.init)
        let types = lines.indices.filter { lines[$0].hasPrefix("# TYPE ") }
        #expect(!types.isEmpty)
        for i in types {
            let name = lines[i].split(separator: " ")[2]
            let help = SluiceMetrics.catalog.first { $0.name == name }?.help
            #expect(i > 0 && lines[i - 1] == "# HELP \(name) \(help ?? "?")", "\(lines[i])")
        }
        let sample = Array("x 1\n# TYPE sluice_tunnels_total counter\nsluice_tunnels_total 1\n".utf8)
        #expect(
            String(decoding: SluiceMetrics.withHelp(sample), as: UTF8.self)
                == "x 1\n# HELP sluice_tunnels_total CONNECT tunnels and upgraded connections (101 Switching Protocols: WebSocket) opened\n# TYPE sluice_tunnels_total counter\nsluice_tunnels_total 1\n"
        )
    }

    @Test func recordsFinishedExchangesRetriesTrustAndTimings() {
        let monitor = MetricsMonitor()
        let requests = #"sluice_requests_total{policy="metrics-test",method="other",status_class="5xx"}"#
        let bytesOut = "sluice_response_body_bytes_total"
        let retries = #"sluice_retries_total{reason="metrics-test-503"}"#
        let trust = #"sluice_trust_failures_total{evaluator="metrics-test-pins"}"#
        let firstByte = "sluice_upstream_first_byte_seconds_count"
        let before = [requests, bytesOut, retries, trust, firstByte].map(value)

        var summary = ExchangeSummary(id: 1, client: "127.0.0.1:1", method: "BREW", url: "http://x/", policy: "metrics-test")
        summary.status = 503
        summary.bytesOut = 1000
        var timings = TryTimings()
        timings.firstByte = 1500
        timings.total = 2000
        summary.timings = timings
        monitor.handle(.finished(summary))
        monitor.handle(.finished(summary))
        monitor.handle(.retrying(id: 1, record: RetryRecord(attempt: 1, delayMilliseconds: 5, reason: "metrics-test-503")))
        monitor.handle(.trustFailed(id: 1, host: "x", evaluator: "metrics-test-pins", reason: "pin"))

        let after = [requests, bytesOut, retries, trust, firstByte].map(value)
        #expect(after[0] - before[0] == 2)
        #expect(after[1] - before[1] == 2000)
        #expect(after[2] - before[2] == 1)
        #expect(after[3] - before[3] == 1)
        #expect(after[4] - before[4] == 2)
    }

    @Test func methodsAreABoundedLabel() {
        #expect(MetricsMonitor.MethodClass("GET") == .get)
        #expect(MetricsMonitor.MethodClass("CONNECT") == .connect)
        #expect(MetricsMonitor.MethodClass("get") == .other)
        #expect(MetricsMonitor.MethodClass("X-ANYTHING") == .other)
    }
}

import Foundation
import Testing

@testable import SluiceCore

/// What the dashboard counts of each finished exchange: the error chart's split (origin 5xx,
/// Sluice's own answers by kind, broken responses), the cache's share, the rate-limit waits,
/// and each host's last failed exchanges.
@Suite struct DashboardStatsTests {
    private func summary(
        _ url: String = "http://a.test/p", status: Int = 200, outcome: Outcome = .ok, kind: ProxyError.Kind? = nil,
        bytes: Int64 = 0
    ) -> ExchangeSummary {
        var s = ExchangeSummary(id: 1, client: "c", method: "GET", url: url, policy: "default")
        s.host = "a.test"
        s.status = status
        s.outcome = outcome
        s.errorKind = kind
        s.bytesOut = bytes
        s.attempts = 1
        return s
    }

    @Test func eachExchangeCountsOnceWhereItBelongs() {
        let stats = DashboardStats()
        let shard = stats.shardForCurrentThread()
        shard.record(summary(status: 200, bytes: 10), host: "a.test")
        shard.record(summary(status: 503, bytes: 5), host: "a.test")
        var refused = summary(status: 429, outcome: .error, kind: .rateLimited)
        refused.error = "rate limit of policy p reached"
        shard.record(refused, host: "a.test")
        shard.record(summary(status: 502, outcome: .error, kind: .upstreamRefused), host: "a.test")
        shard.record(summary(status: 200, outcome: .upstreamAborted, bytes: 100), host: "a.test")
        var hit = summary(bytes: 40)
        hit.cache = "hit"
        hit.servedFromStore = true
        shard.record(hit, host: "a.test")
        var miss = summary(bytes: 40)
        miss.cache = "fwd=uri-miss; stored"
        var waited = miss
        waited.rateLimit = RateLimitRecord(decision: .waited, waitedMilliseconds: 20)
        shard.record(waited, host: "a.test")
        shard.recordRefusal(.tooManyConnections)
        let o = stats.snapshot().outcomes
        #expect(o.origin5xx == 1)
        #expect(o.refusals == [.rateLimited: 1, .upstreamRefused: 1, .tooManyConnections: 1])
        #expect(o.failures == 1)
        #expect(o.cacheLookups == 2 && o.cacheServed == 1)
        #expect(o.bytesFromCache == 40 && o.bytesFromOrigin == 10 + 5 + 100 + 40)
        #expect(o.quotaWaits == 1)

        #expect(stats.snapshot().errors == 4)
    }

    @Test func aHostKeepsItsLastFailedExchangesWithTheirKindAndNoQuery() throws {
        let stats = DashboardStats()
        let shard = stats.shardForCurrentThread()
        shard.record(summary(status: 200), host: "a.test")
        var denied = summary("http://a.test/x?api_key=s3cret#frag", status: 403, outcome: .error, kind: .destinationDenied)
        denied.error = "destination a.test is denied by access.deny"
        shard.record(denied, host: "a.test")
        shard.record(summary("http://a.test/y", status: 500), host: "a.test")
        shard.record(summary("http://a.test/z", status: 200, outcome: .upstreamAborted), host: "a.test")
        let failed = stats.failedExchanges(host: "a.test")
        #expect(failed.map(\.kind) == ["destination_denied", "origin_5xx", "broken"])
        #expect(failed[0].url == "http://a.test/x?…" && failed[0].status == 403)
        #expect(failed[0].error == "destination a.test is denied by access.deny")
        #expect(failed.allSatisfy { !$0.url.contains("s3cret") })
        #expect(stats.failedExchanges(host: "b.test").isEmpty)
        for i in 0..<60 {
            shard.record(summary("http://a.test/\(i)", status: 502, outcome: .error, kind: .dnsFailure), host: "a.test")
        }
        let last = stats.failedExchanges(host: "a.test")
        #expect(last.count == DashboardStats.failuresPerHost)
        #expect(last.first?.url == "http://a.test/10" && last.last?.url == "http://a.test/59")
        var long = summary("http://a.test/" + String(repeating: "p", count: 500), status: 500)
        long.method = String(repeating: "M", count: 8000)  // a token of any length is a method
        long.error = String(repeating: "e", count: 5000)
        shard.record(long, host: "a.test")
        let kept = try #require(stats.failedExchanges(host: "a.test").last)
        #expect(kept.url.count == DashboardStats.failedURLLimit + 1 && kept.method.count == 17)
        #expect(kept.error?.count == DashboardStats.failedErrorLimit + 1)
    }

    @Test func aHostsMeanCountsOnlyTheExchangesThatWentUpstream() {
        let stats = DashboardStats()
        let shard = stats.shardForCurrentThread()
        var upstream = summary()
        upstream.timings = TryTimings()
        upstream.timings?.total = 4000
        shard.record(upstream, host: "a.test")
        var hit = summary()
        hit.servedFromStore = true
        shard.record(hit, host: "a.test")
        let row = stats.snapshot().hosts[0].row
        #expect(row.requests == 2 && row.timedRequests == 1 && row.totalMicroseconds == 4000)
    }

    @Test func everyKindIsListedInTheErrorsDoc() throws {
        let docs = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .appendingPathComponent("../../docs/errors.md").standardized
        let text = try String(contentsOf: docs, encoding: .utf8)
        let table = try #require(text.components(separatedBy: "## Kinds").last)
        let listed = table.split(separator: "\n").filter { $0.hasPrefix("| `") }.map {
            $0.split(separator: "`")[1]
        }
        #expect(Set(listed.map(String.init)) == Set(ProxyError.Kind.allCases.map(\.rawValue)))
        #expect(listed.count == ProxyError.Kind.allCases.count)
    }
}

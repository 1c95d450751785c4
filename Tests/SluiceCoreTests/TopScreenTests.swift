import Foundation
import Testing

@testable import SluiceCore

/// `sluice top`'s screen: rates from two samples, hosts busiest first, and lines that fit.
@Suite struct TopScreenTests {
    typealias Host = TopScreen.Sample.Host

    private func sample(at ms: Int64, requests: Int64, errors: Int64 = 0, hosts: [Host]) -> TopScreen.Sample {
        TopScreen.Sample(
            timeMilliseconds: ms, requests: requests, errors: errors, inFlight: 2, connections: 3, p50: 1.5, hosts: hosts)
    }

    @Test func ratesComeFromTwoSamplesAndOrderTheHosts() {
        let first = sample(
            at: 1000, requests: 100, hosts: [Host(host: "a.test", requests: 90), Host(host: "b.test", requests: 10)])
        // In the next 2 s, b.test got 40 requests and a.test 10: b.test is busier now.
        let second = sample(
            at: 3000, requests: 150, errors: 5,
            hosts: [Host(host: "a.test", requests: 100), Host(host: "b.test", requests: 50), Host(host: "c.test", requests: 1)])
        let screen = TopScreen(source: "127.0.0.1:9901", sample: second, previous: first)
        #expect(screen.rate == 25)
        #expect(screen.errorShare == 0.1)
        #expect(screen.rows.map(\.host) == ["b.test", "a.test", "c.test"])
        #expect(screen.rows.map(\.rate) == [20, 5, 0.5])
    }

    @Test func aHostNewToAFullListHasNoRate() {
        // 50 hosts were sent before; a host that was 51st then has no known earlier total.
        let earlier = (0..<TopScreen.hostRowsSent).map { Host(host: "h\($0)", requests: 1000) }
        let first = sample(at: 0, requests: 50_000, hosts: earlier)
        let second = sample(at: 1000, requests: 51_000, hosts: earlier + [Host(host: "newcomer", requests: 900)])
        let screen = TopScreen(source: "x", sample: second, previous: first)
        #expect(screen.rows.first { $0.host == "newcomer" }?.rate == nil)
        #expect(screen.rows.last?.host == "newcomer")
    }

    @Test func theFirstScreenHasNoRatesAndSortsByTotals() {
        let screen = TopScreen(
            source: "x", sample: sample(at: 1, requests: 3, hosts: [Host(host: "z", requests: 1), Host(host: "y", requests: 2)]),
            previous: nil)
        #expect(screen.rate == nil && screen.rows.map(\.host) == ["y", "z"] && screen.rows.allSatisfy { $0.rate == nil })
        let lines = screen.render(width: 100, height: 20, clock: "12:00:00")
        #expect(lines[0] == "sluice top — x — generation 1 — 12:00:00   (q quits)")
        #expect(lines[1].hasPrefix("req/s –   errors –   retries/s –   in flight 2   connections 3   total 3"))
        #expect(lines[2] == "upstream ms: p50 1.50   p90 –   p99 –")
    }

    @Test func linesFitTheTerminal() {
        let hosts = (0..<30).map { Host(host: "host-\($0)-with-a-rather-long-name.example.com", requests: Int64(100 - $0)) }
        let screen = TopScreen(source: "127.0.0.1:9901", sample: sample(at: 1, requests: 1000, hosts: hosts), previous: nil)
        let lines = screen.render(width: 80, height: 15, clock: "00:00:01")
        #expect(lines.count == 15)
        #expect(lines.allSatisfy { $0.count <= 80 })
        #expect(lines.last == "… 21 more host(s)")
        #expect(lines[5].hasPrefix("host-0-with"))
    }

    @Test func numbersAreRounded() {
        #expect(TopScreen.number(2.345, 2) == "2.35" || TopScreen.number(2.345, 2) == "2.34")
        #expect(TopScreen.number(0.05, 1) == "0.1")
        #expect(TopScreen.number(12, 0) == "12")
        #expect(TopScreen.number(nil, 1) == "–")
        #expect(TopScreen.number(.infinity, 1) == "–")
        #expect(TopScreen.number(3.04, 2) == "3.04")
    }

    @Test func decodesTheDashboardData() throws {
        let json = """
            {"time_ms":5,"configuration_generation":2,"requests":7,"errors":1,"retries":0,"in_flight":0,"connections":1,
             "p50_ms":null,"p90_ms":null,"p99_ms":null,"recording":true,"limits":[],
             "hosts":[{"host":"a","requests":7,"errors":1,"retries":0,"bytes_out":99,"mean_ms":0.5}]}
            """
        let decoded = try JSONDecoder().decode(TopScreen.Sample.self, from: Data(json.utf8))
        #expect(
            decoded.configurationGeneration == 2
                && decoded.hosts == [Host(host: "a", requests: 7, errors: 1, bytesOut: 99, meanMilliseconds: 0.5)])
    }
}

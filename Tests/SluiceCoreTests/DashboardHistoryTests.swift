import Testing

@testable import SluiceCore

/// The dashboard's 15-minute ring: oldest first, fixed size, its memory stated; the refusal
/// kinds' columns and the hosts' rings aligned with it.
@Suite struct DashboardHistoryTests {
    private func sample(_ t: Int64) -> DashboardHistory.Sample {
        DashboardHistory.Sample(
            timeMilliseconds: t * 1000, requests: t, errors: 0, retries: 0, bytesOut: 0, inFlight: 0, connections: 0,
            p50: nil, p99: nil)
    }

    private func row(requests: Int64, errors: Int64 = 0, bytes: Int64 = 0, micros: Int64 = 0) -> DashboardStats.HostRow {
        var r = DashboardStats.HostRow()
        r.requests = requests
        r.errors = errors
        r.bytesOut = bytes
        r.totalMicroseconds = micros
        r.timedRequests = micros > 0 ? requests : 0
        return r
    }

    @Test func keepsTheLastFifteenMinutesOldestFirst() {
        var history = DashboardHistory()
        #expect(history.samples.isEmpty)
        for t in 1...3 { history.append(sample(Int64(t))) }
        #expect(history.samples.map(\.requests) == [1, 2, 3])
        for t in 4...1000 { history.append(sample(Int64(t))) }
        #expect(history.count == DashboardHistory.capacity)
        let kept = history.samples.map(\.requests)
        #expect(kept.first == 101 && kept.last == 1000)
        #expect(kept == Array(101...1000))
    }

    @Test func samplesCarryTheOutcomes() {
        var outcomes = DashboardStats.Outcomes()
        outcomes.origin5xx = 2
        outcomes.refusals = [.rateLimited: 3, .upstreamRefused: 1]
        outcomes.failures = 1
        outcomes.cacheLookups = 10
        outcomes.cacheServed = 7
        outcomes.bytesFromCache = 700
        outcomes.bytesFromOrigin = 300
        outcomes.quotaWaits = 4
        let s = DashboardHistory.Sample(
            timeMilliseconds: 1, requests: 10, errors: 3, retries: 0, bytesOut: 1000, inFlight: 0, connections: 0,
            p50: nil, p99: nil, outcomes: outcomes)
        #expect(s.origin5xx == 2 && s.refusals == 4 && s.failures == 1 && s.quotaWaits == 4)
        #expect(s.cacheLookups == 10 && s.cacheServed == 7 && s.bytesFromCache == 700 && s.bytesFromOrigin == 300)
    }

    @Test func refusalKindsGetAColumnFromTheirFirstSecondWithZerosBefore() {
        var history = DashboardHistory()
        history.append(sample(1))
        history.append(sample(2), refusals: [.rateLimited: 2])
        history.append(sample(3), refusals: [.rateLimited: 5, .destinationDenied: 1])
        let columns = history.refusalsByKind
        #expect(columns.map(\.kind) == [.destinationDenied, .rateLimited])
        #expect(columns[0].totals == [0, 0, 1])
        #expect(columns[1].totals == [0, 2, 5])
        // Past the ring's end the columns turn with it.
        for t in 4...(Int64(DashboardHistory.capacity) + 2) {
            history.append(sample(t), refusals: [.rateLimited: t, .destinationDenied: 1])
        }
        let turned = history.refusalsByKind
        #expect(turned[1].totals.count == DashboardHistory.capacity)
        #expect(turned[1].totals.first == 5 && turned[1].totals.last == Int64(DashboardHistory.capacity) + 2)
        #expect(history.memoryBytes == DashboardHistory.ringBytes + 2 * DashboardHistory.capacity * 8)
    }

    @Test func aHostsRingHoldsItsOwnSecondsAlignedWithTheSamples() throws {
        var history = DashboardHistory()
        history.append(sample(1), hosts: [("a", row(requests: 0))])
        #expect(history.host("a") == nil, "no ring before a request")
        history.append(sample(2), hosts: [("a", row(requests: 4, errors: 1, bytes: 400, micros: 8000))])
        history.append(sample(3), hosts: [("a", row(requests: 4, errors: 1, bytes: 400, micros: 8000))])
        history.append(
            sample(4), hosts: [("a", row(requests: 6, errors: 1, bytes: 1000, micros: 9000)), ("b", row(requests: 1))])
        let a = try #require(history.host("a"))
        #expect(a.map(\.requests) == [0, 4, 0, 2])
        #expect(a.map(\.errors) == [0, 1, 0, 0])
        #expect(a.map(\.bytesOut) == [0, 400, 0, 600])
        #expect(a[1].meanMilliseconds == 2 && a[2].meanMilliseconds.isNaN && a[3].meanMilliseconds == 0.5)
        #expect(try #require(history.host("b")).map(\.requests) == [0, 0, 0, 1])
        #expect(history.hostRingCount == 2)
        #expect(history.memoryBytes == DashboardHistory.ringBytes + 2 * DashboardHistory.hostRingBytes)
    }

    @Test func aHostQuietForTheWholeWindowLosesItsRing() {
        var history = DashboardHistory()
        history.append(sample(0), hosts: [("a", row(requests: 1))])
        for t in 1..<Int64(DashboardHistory.capacity) { history.append(sample(t), hosts: [("a", row(requests: 1))]) }
        #expect(history.host("a") != nil, "its request is still in the window")
        history.append(sample(Int64(DashboardHistory.capacity)), hosts: [("a", row(requests: 1))])
        #expect(history.host("a") == nil)
        #expect(history.hostRingCount == 0)
    }

    @Test func whenEveryRingIsHeldTheBusiestOfTheSecondTakeTheQuietestOnes() throws {
        var history = DashboardHistory()
        let n = DashboardHistory.maxHostRings
        // More hosts than rings in one second: the busiest get them.
        let first = (0..<(n + 5)).map { ("h\($0)", row(requests: Int64(n + 5 - $0))) }
        history.append(sample(1), hosts: first)
        #expect(history.hostRingCount == n)
        #expect(history.host("h0") != nil && history.host("h\(n - 1)") != nil && history.host("h\(n)") == nil)
        // Next second h0…h9 get traffic again, and two new hosts: they take the rings of two
        // hosts quiet since, not of one active now.
        var next = first.map { ($0.0, $0.1) }
        for i in 0..<10 { next[i].1.requests += 1 }
        next.append(("new-a", row(requests: 3)))
        next.append(("new-b", row(requests: 1)))
        history.append(sample(2), hosts: next)
        #expect(history.hostRingCount == n)
        #expect(try #require(history.host("new-a")).map(\.requests) == [0, 3])
        #expect(try #require(history.host("new-b")).map(\.requests) == [0, 1])
        #expect((0..<10).allSatisfy { history.host("h\($0)") != nil })
        // A second where every ring's host is active: a newcomer waits.
        var busy = next
        for i in busy.indices { busy[i].1.requests += 1 }
        busy.append(("late", row(requests: 1)))
        let active = Set((0..<n).compactMap { i -> String? in history.host("h\(i)") != nil ? "h\(i)" : nil })
        history.append(sample(3), hosts: busy.filter { active.contains($0.0) || $0.0.hasPrefix("new") || $0.0 == "late" })
        #expect(history.host("late") == nil)
    }

    @Test func itsMemoryIsBoundedAndStated() {
        #expect(DashboardHistory.capacity == 900)
        #expect(DashboardHistory.ringBytes == 900 * MemoryLayout<DashboardHistory.Sample>.stride)
        #expect(DashboardHistory.hostRingBytes == 900 * 16)
        #expect(DashboardHistory.ringBytes <= 160_000)
        #expect(DashboardHistory().memoryBytes == DashboardHistory.ringBytes)
        #expect(
            DashboardHistory.maximumBytes
                == DashboardHistory.ringBytes + ProxyError.Kind.allCases.count * 900 * 8 + 200 * 900 * 16)
    }
}

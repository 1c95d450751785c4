import Testing

@testable import SluiceCore

/// The dashboard's 15-minute ring: oldest first, fixed size, its memory stated.
@Suite struct DashboardHistoryTests {
    private func sample(_ t: Int64) -> DashboardHistory.Sample {
        DashboardHistory.Sample(
            timeMilliseconds: t * 1000, requests: t, errors: 0, retries: 0, bytesOut: 0, inFlight: 0, connections: 0,
            p50: nil, p99: nil)
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

    @Test func itsMemoryIsBoundedAndStated() {
        #expect(DashboardHistory.capacity == 900)
        #expect(DashboardHistory.memoryBytes == 900 * MemoryLayout<DashboardHistory.Sample>.stride)
        #expect(DashboardHistory.memoryBytes <= 100_000)
    }
}

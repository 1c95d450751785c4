import Testing

@testable import SluiceServer

@Suite struct AcceptBatchTests {
    @Test func firstAcceptWatchesThePassEndAndTheLimitPauses() {
        var batch = AcceptBatch()
        #expect(batch.accepted() == .init(watchPassEnd: true, pause: AcceptBatch.limit == 1))
        for n in 2...AcceptBatch.limit {
            #expect(batch.accepted() == .init(watchPassEnd: false, pause: n == AcceptBatch.limit))
        }
        let paused = batch.passEnded()
        #expect(paused)
    }

    @Test func aPassUnderTheLimitLeavesTheListenerOnAndTheNextStartsAgain() {
        var batch = AcceptBatch()
        _ = batch.accepted()
        let first = batch.passEnded()
        #expect(!first)
        let next = batch.accepted()
        #expect(next.watchPassEnd)
        let second = batch.passEnded()
        let third = batch.passEnded()
        #expect(!second && !third)
    }

    @Test func aFullBatchEndsOnceAndTheNextPassCountsFromOne() {
        var batch = AcceptBatch()
        for _ in 0..<AcceptBatch.limit { _ = batch.accepted() }
        let paused = batch.passEnded()
        #expect(paused)
        #expect(batch.accepted() == .init(watchPassEnd: true, pause: AcceptBatch.limit == 1))
    }
}

import Testing

@testable import SluiceCore

/// GCRA and the limiter's table, with the clock given: exact delays, bursts, several limits,
/// refusals that change nothing, places given back, a bounded table.
@Suite struct RateLimitTests {
    static let ms: Int64 = 1000
    static let s: Int64 = 1_000_000

    func go(_ decision: RateLimiter.Decision) -> Int64? {
        if case .go(let delay, _) = decision { return delay }
        return nil
    }

    @Test func requestsAreSpacedByTheEmissionInterval() {
        var limiter = RateLimiter(limits: [RateLimit(requests: 10, periodMilliseconds: 1000)])
        let big = 10 * Self.s
        #expect(go(limiter.acquire("k", now: 0, maxWait: big)) == 0)
        #expect(go(limiter.acquire("k", now: 0, maxWait: big)) == 100 * Self.ms)
        #expect(go(limiter.acquire("k", now: 0, maxWait: big)) == 200 * Self.ms)
        // The schedule runs to 300 ms: a request at 250 ms goes at 300 ms.
        #expect(go(limiter.acquire("k", now: 250 * Self.ms, maxWait: big)) == 50 * Self.ms)
        // Another key has a schedule of its own.
        #expect(go(limiter.acquire("other", now: 250 * Self.ms, maxWait: big)) == 0)
        // After a quiet spell the schedule starts again from the clock (no credit is saved).
        #expect(go(limiter.acquire("k", now: 5 * Self.s, maxWait: big)) == 0)
        #expect(go(limiter.acquire("k", now: 5 * Self.s, maxWait: big)) == 100 * Self.ms)
    }

    @Test func aBurstGoesAtOnceThenTheRateHolds() {
        var limiter = RateLimiter(limits: [RateLimit(requests: 50, periodMilliseconds: 1000, burst: 5)])
        for _ in 0..<5 { #expect(go(limiter.acquire("k", now: 0, maxWait: 0)) == 0) }
        #expect(limiter.acquire("k", now: 0, maxWait: 0) == .refuse(retryAfter: 20 * Self.ms, limit: 0))
        #expect(go(limiter.acquire("k", now: 20 * Self.ms, maxWait: 0)) == 0)
        // 400 requests waiting as long as they must: the n-th (after the burst) goes at
        // (n - 4) x 20 ms, so 50 a second.
        var last: Int64 = 0
        for n in 7...400 {
            guard let delay = go(limiter.acquire("k", now: 20 * Self.ms, maxWait: 100 * Self.s)) else {
                Issue.record("request \(n) refused")
                return
            }
            last = 20 * Self.ms + delay
        }
        #expect(last == Int64(400 - 5) * 20 * Self.ms)
    }

    @Test func aRefusalChangesNothingAndSaysWhenToComeBack() {
        var limiter = RateLimiter(limits: [RateLimit(requests: 2, periodMilliseconds: 1000)])
        #expect(go(limiter.acquire("k", now: 0, maxWait: 0)) == 0)
        for _ in 0..<3 {
            #expect(limiter.acquire("k", now: 100 * Self.ms, maxWait: 0) == .refuse(retryAfter: 400 * Self.ms, limit: 0))
        }
        #expect(go(limiter.acquire("k", now: 500 * Self.ms, maxWait: 0)) == 0)
    }

    @Test func theLongestOfSeveralLimitsDecides() {
        var limiter = RateLimiter(limits: [
            RateLimit(requests: 10, periodMilliseconds: 1000, burst: 10),
            RateLimit(requests: 20, periodMilliseconds: 60_000, burst: 20),
        ])
        var delays: [Int64] = []
        for _ in 0..<21 { delays.append(go(limiter.acquire("k", now: 0, maxWait: 100 * Self.s)) ?? -1) }
        #expect(delays[0..<10].allSatisfy { $0 == 0 }, "the per-second burst")
        let tenASecond: [Int64] = (1...10).map { (n: Int) -> Int64 in Int64(n) * 100 * Self.ms }
        #expect(Array(delays[10..<20]) == tenASecond, "then 10 a second")
        #expect(delays[20] == 3 * Self.s, "the 21st in a minute waits for the per-minute schedule")
        #expect(limiter.acquire("k", now: 0, maxWait: Self.s) == .refuse(retryAfter: 6 * Self.s, limit: 1))
    }

    @Test func aWaiterThatLeavesGivesItsPlaceBack() {
        var limiter = RateLimiter(limits: [RateLimit(requests: 10, periodMilliseconds: 1000)])
        _ = limiter.acquire("k", now: 0, maxWait: Self.s)
        guard case .go(let delay, let reservation) = limiter.acquire("k", now: 0, maxWait: Self.s) else {
            Issue.record("the second request waits")
            return
        }
        #expect(delay == 100 * Self.ms)
        limiter.cancel(reservation)
        #expect(go(limiter.acquire("k", now: 0, maxWait: Self.s)) == 100 * Self.ms, "the place was given back")
        // A place behind which another request already waits stays taken (a gap, never a burst).
        guard case .go(_, let third) = limiter.acquire("k", now: 0, maxWait: Self.s) else { return }
        _ = limiter.acquire("k", now: 0, maxWait: Self.s)
        limiter.cancel(third)
        #expect(go(limiter.acquire("k", now: 0, maxWait: Self.s)) == 400 * Self.ms)
        // The first request of a key that leaves forgets the key.
        guard case .go(_, let only) = limiter.acquire("new", now: 0, maxWait: 0) else { return }
        limiter.cancel(only)
        #expect(limiter.keyCount == 1)
    }

    @Test func theTableIsBounded() {
        var limiter = RateLimiter(limits: [RateLimit(requests: 1, periodMilliseconds: 1000)], capacity: 1000)
        // 10,000 clients, one every 0.1 ms.
        for i in 0..<10_000 { _ = limiter.acquire("client-\(i)", now: Int64(i) * 100, maxWait: 0) }
        #expect(limiter.keyCount == 1000)
        #expect(limiter.evicted == 9000)
        // Keys evicted within a second of their request still had a schedule ahead.
        #expect(limiter.evictedBusy == 9000)
        // The most recent keys are kept: client-9999 is still limited.
        #expect(limiter.acquire("client-9999", now: 999_900, maxWait: 0) == .refuse(retryAfter: Self.s, limit: 0))
    }
}

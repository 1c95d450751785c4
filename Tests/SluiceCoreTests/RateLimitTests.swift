import Synchronization
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
        guard case .go(let delay, let reservation?) = limiter.acquire("k", now: 0, maxWait: Self.s) else {
            Issue.record("the second request waits")
            return
        }
        #expect(delay == 100 * Self.ms)
        limiter.cancel(reservation)
        #expect(go(limiter.acquire("k", now: 0, maxWait: Self.s)) == 100 * Self.ms, "the place was given back")
        // A place behind which another request already waits stays taken (a gap, never a burst).
        guard case .go(_, let third?) = limiter.acquire("k", now: 0, maxWait: Self.s) else { return }
        _ = limiter.acquire("k", now: 0, maxWait: Self.s)
        limiter.cancel(third)
        #expect(go(limiter.acquire("k", now: 0, maxWait: Self.s)) == 400 * Self.ms)
        // The first request of a key that leaves forgets the key (it waited for a hold).
        guard case .go(_, let only?) = limiter.acquire("new", now: 0, maxWait: Self.s, notBefore: 50 * Self.ms) else {
            Issue.record("a request held by the origin waits")
            return
        }
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

    // MARK: the origin's own limits (`learn`)

    func hold(_ status: Int, _ fields: [String: String], now: Int = 1_700_000_000_000) -> RateLimitLearning.Hold? {
        RateLimitLearning.hold(status: status, wallClockNow: now) { fields[$0] }
    }

    @Test func retryAfterOnA429Or503IsAHold() {
        #expect(hold(429, ["retry-after": "2"])?.milliseconds == 2000)
        #expect(hold(503, ["retry-after": "120"])?.reason == "503 with Retry-After: 120")
        // A date: the time left until it.
        #expect(hold(429, ["retry-after": "Tue, 14 Nov 2023 22:13:30 GMT"], now: 1_700_000_000_000)?.milliseconds == 10_000)
        // On a 200 a Retry-After means nothing here; 0, garbage and more than a day are ignored.
        #expect(hold(200, ["retry-after": "5"]) == nil)
        #expect(hold(429, ["retry-after": "0"]) == nil)
        #expect(hold(429, ["retry-after": "soon"]) == nil)
        #expect(hold(429, ["retry-after": "90000"]) == nil)
    }

    @Test func theRateLimitFieldsOfTheDraftAreHolds() {
        // The current draft: a list of policies; the longest t of those with nothing left.
        #expect(hold(200, ["ratelimit": #""burst";r=0;t=3, "daily";r=0;t=40"#])?.milliseconds == 40_000)
        #expect(hold(200, ["ratelimit": #""default";r=5;t=30"#]) == nil)
        // The earlier dictionary, and the separate fields.
        #expect(hold(200, ["ratelimit": "limit=100, remaining=0, reset=7"])?.milliseconds == 7000)
        #expect(hold(200, ["ratelimit-remaining": "0", "ratelimit-reset": "4"])?.milliseconds == 4000)
        #expect(hold(200, ["ratelimit-remaining": "1", "ratelimit-reset": "4"]) == nil)
    }

    @Test func theCommonXRateLimitFieldsAreHolds() {
        #expect(hold(200, ["x-ratelimit-remaining": "0", "x-ratelimit-reset": "2"])?.milliseconds == 2000)
        // GitHub sends the Unix time of the reset.
        let github = hold(403, ["x-ratelimit-remaining": "0", "x-ratelimit-reset": "1700000030"], now: 1_700_000_000_000)
        #expect(github?.milliseconds == 30_000)
        #expect(hold(200, ["x-ratelimit-remaining": "0", "x-ratelimit-reset-after": "1.5"])?.milliseconds == 1500)
        #expect(hold(200, ["x-ratelimit-remaining": "3", "x-ratelimit-reset": "60"]) == nil)
        // A Unix time in milliseconds; values no one should believe, and a number too large
        // for an integer, hold nothing (and never trap).
        #expect(
            hold(200, ["x-ratelimit-remaining": "0", "x-ratelimit-reset": "1700000004000"], now: 1_700_000_000_000)?
                .milliseconds == 4000)
        for value in ["1e16", "inf", "nan", "-1", "0x1p64"] {
            #expect(hold(200, ["x-ratelimit-remaining": "0", "x-ratelimit-reset-after": value]) == nil, "\(value)")
        }
        #expect(hold(200, ["x-ratelimit-remaining": "0", "x-ratelimit-reset": "99999999999999999999"]) == nil)
        // The longest of several.
        let both = hold(429, ["retry-after": "1", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "9"])
        #expect(both?.milliseconds == 9000 && both?.reason.hasPrefix("X-RateLimit-Remaining: 0") == true)
    }

    @Test func aHoldDelaysTheKeyAndThenTheScheduleRunsFromItsEnd() {
        let table = RateLimitTable(capacity: 100)
        let settings = RateLimitSettings(limits: [RateLimit(requests: 10, periodMilliseconds: 1000)])
        table.learn(policy: "p", key: "api", hold: .init(milliseconds: 2000, reason: "429"), now: 0)
        #expect(table.holdRemaining(policy: "p", key: "api", now: 500 * Self.ms) == 1500 * Self.ms)
        guard case .go(let first, _) = table.acquire(policy: "p", settings, key: "api", now: 0, maxWait: 5 * Self.s),
            case .go(let second, _) = table.acquire(policy: "p", settings, key: "api", now: 0, maxWait: 5 * Self.s)
        else {
            Issue.record("both wait for the hold")
            return
        }
        #expect(first == 2 * Self.s && second == 2 * Self.s + 100 * Self.ms)
        // Longer than the request may wait: refused, by the schedule that runs from the hold's end…
        #expect(
            table.acquire(policy: "p", settings, key: "api", now: 0, maxWait: Self.s)
                == .refuse(retryAfter: 2_200 * Self.ms, limit: 0))
        // …or by the hold itself (no limit index).
        table.learn(policy: "p", key: "b", hold: .init(milliseconds: 5000, reason: "503"), now: 0)
        #expect(
            table.acquire(policy: "p", settings, key: "b", now: 0, maxWait: Self.s) == .refuse(retryAfter: 5 * Self.s, limit: nil)
        )
        // Other keys and other policies are not held; a hold never shortens.
        #expect(table.holdRemaining(policy: "p", key: "other", now: 0) == 0)
        table.learn(policy: "p", key: "api", hold: .init(milliseconds: 500, reason: "short"), now: 0)
        #expect(table.holdReason(policy: "p", key: "api") == "429")
        // A policy with no rates: only the hold.
        let learnOnly = RateLimitSettings(limits: [])
        #expect(
            table.acquire(policy: "p", learnOnly, key: "api", now: Self.s, maxWait: 5 * Self.s)
                == .go(delay: Self.s, reservation: nil))
        #expect(table.acquire(policy: "p", learnOnly, key: "api", now: 3 * Self.s, maxWait: 0) == .go(delay: 0, reservation: nil))
        // The ended hold was forgotten; the other is listed.
        let state = table.snapshot(now: 0).first { $0.policy == "p" }
        #expect(state?.counts.learned == 2 && state?.holds.map(\.key) == ["b"])
    }

    @Test func holdsStayWithinTheTablesCapacity() {
        let table = RateLimitTable(capacity: 10)
        for i in 0..<50 { table.learn(policy: "p", key: "k\(i)", hold: .init(milliseconds: 1000 + i, reason: "r"), now: 0) }
        #expect(table.snapshot(now: 0).first?.holds.count == 10)
        // The latest are kept (the soonest to end went first).
        #expect(table.holdRemaining(policy: "p", key: "k49", now: 0) > 0)
    }

    // MARK: max_concurrent

    @Test func placesGoFirstComeFirstServedAndAreHandedOn() {
        var lines = ConcurrencyLimiter()
        let r1 = lines.acquire("k", limit: 2, ticket: 1, queue: true)
        #expect(r1)
        let r2 = lines.acquire("k", limit: 2, ticket: 2, queue: true)
        #expect(r2)
        let r3 = lines.acquire("k", limit: 2, ticket: 3, queue: true)
        #expect(!r3)
        let r4 = lines.acquire("k", limit: 2, ticket: 4, queue: true)
        #expect(!r4)
        let r5 = lines.acquire("k", limit: 2, ticket: 5, queue: false)
        #expect(!r5, "reject mode: nothing recorded")
        #expect(lines.waiting("k") == 2)
        // The longest waiter gets the place that frees.
        let r6 = lines.release("k", limit: 2)
        #expect(r6 == [3])
        let r7 = lines.leave("k", ticket: 4)
        #expect(r7)
        let r8 = lines.leave("k", ticket: 3)
        #expect(!r8, "3 holds its place already")
        let r9 = lines.release("k", limit: 2)
        #expect(r9 == [])
        #expect(lines.inFlight("k") == 1)
        let r10 = lines.release("k", limit: 2)
        #expect(r10 == [])
        #expect(lines.keyCount == 0, "an idle key is forgotten")
        // A raised limit hands out several places at once.
        for t in 10..<14 { _ = lines.acquire("k", limit: 1, ticket: UInt64(t), queue: true) }
        let r11 = lines.release("k", limit: 3)
        #expect(r11 == [11, 12, 13])
    }

    @Test func aWaiterWhoseWorkerIsGonePassesItsPlaceOn() {
        let table = RateLimitTable()
        let woken = Mutex<[UInt64]>([])
        #expect(table.acquireSlot(policy: "p", key: "k", limit: 1, queue: true, wake: { _ in true }) == .go)
        guard case .wait(let gone)? = table.acquireSlot(policy: "p", key: "k", limit: 1, queue: true, wake: { _ in false }),
            case .wait(let next)? = table.acquireSlot(
                policy: "p", key: "k", limit: 1, queue: true,
                wake: { t in
                    woken.withLock { $0.append(t) }
                    return true
                })
        else {
            Issue.record("both wait")
            return
        }
        #expect(table.acquireSlot(policy: "p", key: "k", limit: 1, queue: false, wake: { _ in true }) == nil)
        table.releaseSlot(policy: "p", key: "k", limit: 1)
        #expect(woken.withLock { $0 } == [next], "\(gone) could not be told: its place went on")
        #expect(table.snapshot(now: 0).first?.inFlight == 1)
    }
}

import HTTPTypes
import SluiceCore
import Testing

// The exchange state machine driven without sockets (ExchangeMachineHarness.swift). Each test
// is a row the e2e suite (Tests/e2e/test_retry.py, test_redirects.py, test_oauth.py,
// test_auth.py) checks against real servers by wall clock.

// MARK: - Attempts, limit, methods, statuses

@Suite struct ExchangeMachineRetryTests {
    @Test func failTwiceThenSucceedWithLimit2() {
        var h = Harness(policy(retry: retry(limit: 2, scale: 100)))
        h.begin()
        let s = h.run([.status(503), .status(503), .status(200)])
        #expect(s.status == 200 && s.outcome == .ok && s.attempts == 3)
        #expect(h.delays == [100, 200])
        #expect(s.retries.map(\.reason) == ["status 503", "status 503"])
        #expect(s.retryStopped == nil)
    }

    @Test func limit1PassesTheLast503ThroughUnchanged() {
        var h = Harness(policy(retry: retry(limit: 1, scale: 100)))
        h.begin()
        let s = h.run([.status(503)])
        #expect(s.status == 503 && s.outcome == .ok && s.attempts == 2)
        #expect(s.retryStopped == .limit)
        #expect(
            h.events == [
                "event received GET http://api.test/x default", "event retrying 1 after 100 (status 503)",
                "event metrics 1", "event retry stopped: limit", "event response 503 on try 2", "event metrics 2",
                "event finished 503 ok attempts 2",
            ])
        #expect(h.log.filter { $0 == "send" }.count == 1, "only the last try's response reaches the client")
    }

    @Test func withoutRetrySectionATryIsMadeOnce() {
        var h = Harness(policy(adapters: [HeaderAdapter.header(HTTPField.Name("X-P")!, "1")]))
        h.begin()
        let s = h.run([.status(503)])
        #expect(s.attempts == 1 && s.retries.isEmpty && s.retryStopped == nil && s.status == 503)
    }

    @Test func emptyRetrySectionUsesTheDocumentedDefaults() {
        var h = Harness(policy(retry: RetryPolicy(budget: nil)))
        h.begin()
        let s = h.run([.status(503)])
        #expect(h.delays == [500, 1000])
        #expect(s.attempts == 3 && s.retryStopped == .limit)
    }

    @Test(arguments: [("PUT", 2), ("DELETE", 2), ("OPTIONS", 2), ("HEAD", 2), ("POST", 1), ("PATCH", 1)])
    func defaultMethodsAreTheIdempotentOnes(method: String, tries: Int) {
        var h = Harness(policy(retry: retry(limit: 1, scale: 50)), method: method)
        h.begin()
        let s = h.run([.status(503), .status(200)])
        #expect(s.attempts == tries)
        #expect(s.retryStopped == (tries == 1 ? .method : nil))
        #expect(s.status == (tries == 2 ? 200 : 503))
    }

    @Test func listedMethodsAreRetried() {
        var h = Harness(policy(retry: retry(limit: 2, scale: 50, methods: ["GET", "POST"])), method: "POST")
        h.begin()
        #expect(h.run([.status(503), .status(200)]).attempts == 2)
    }

    @Test func a429IsNotRetriedUnlessListed() {
        var h = Harness(policy(retry: retry()))
        h.begin()
        let s = h.run([.status(429, retryAfter: "1"), .status(200)])
        #expect(s.status == 429 && s.attempts == 1 && s.retryStopped == nil)
        #expect(!h.machine.responseFields(for: 429).contains(.retryAfter), "Retry-After is not even read")
    }

    @Test func retryStoppedOnlyForRetriableFailures() {
        // a status outside `statuses`, a success, a transport error outside `errors`: whatever the method
        for (method, upstream) in [
            ("GET", Upstream.status(404)), ("POST", .status(404)), ("POST", .status(200)),
            ("POST", .refused), ("GET", .refused),
        ] {
            var h = Harness(policy(retry: retry(errors: [.reset])), method: method)
            h.begin()
            let s = h.run([upstream])
            #expect(s.attempts == 1 && s.retryStopped == nil && s.retries.isEmpty, "\(method) \(upstream)")
        }
    }

    @Test func onlyTheLastTrysResponseIsSent() {
        var h = Harness(policy(retry: retry(limit: 2)))
        h.begin()
        h.run([.status(503), .status(502), .status(200)])
        #expect(h.log.filter { $0 == "discard" }.count == 2)
        #expect(h.log.filter { $0 == "send" }.count == 1)
        #expect(h.log.filter { $0.hasPrefix("event response") } == ["event response 200 on try 3"])
    }
}

// MARK: - Backoff and jitter

@Suite struct ExchangeMachineBackoffTests {
    @Test func backoffIsExponential() {
        var h = Harness(policy(retry: retry(limit: 3, base: 2, scale: 200)))
        h.begin()
        let s = h.run([.status(503), .status(503), .status(503), .status(200)])
        #expect(h.delays == [200, 400, 800])
        #expect(s.retries.map(\.delayMilliseconds) == [200, 400, 800])
        #expect(s.status == 200 && s.attempts == 4)
    }

    @Test func maxDelayCapsTheBackoff() {
        var h = Harness(policy(retry: retry(limit: 3, base: 4, scale: 200, maxDelay: 300)))
        h.begin()
        h.run([.status(503), .status(503), .status(503), .status(200)])
        #expect(h.delays == [200, 300, 300])
    }

    @Test func noJitterIsExact() {
        for seed in 1...5 as ClosedRange<UInt64> {
            var h = Harness(policy(retry: retry(limit: 4, scale: 100, jitter: .none)), seed: seed)
            h.begin()
            h.run([.status(503), .status(503), .status(503), .status(503), .status(200)])
            #expect(h.delays == [100, 200, 400, 800])
        }
    }

    @Test(arguments: [RetryPolicy.Jitter.full, .equal])
    func jitterBounds(jitter: RetryPolicy.Jitter) {
        let nominal = [100, 200, 400, 800]
        var all: [(Int, Int)] = []
        for seed in 1...20 as ClosedRange<UInt64> {
            var h = Harness(policy(retry: retry(limit: 4, scale: 100, jitter: jitter)), seed: seed)
            h.begin()
            let s = h.run([.status(503), .status(503), .status(503), .status(503), .status(200)])
            #expect(s.retries.map(\.delayMilliseconds) == h.delays, "the logged delay is the one waited")
            for (delay, d) in zip(h.delays, nominal) {
                let low = jitter == .equal ? d / 2 : 0
                #expect(low <= delay && delay <= d, "\(jitter): \(delay) outside [\(low), \(d)]")
                all.append((delay, d))
            }
        }
        let top = jitter == .full ? 0.9 : 0.95
        #expect(all.contains { Double($0.0) < top * Double($0.1) }, "jitter never moved the delays")
    }

    @Test func jitterIsDeterministicForASeed() {
        func delays(_ seed: UInt64) -> [Int] {
            var h = Harness(policy(retry: retry(limit: 3, scale: 1000, jitter: .full)), seed: seed)
            h.begin()
            h.run([.status(503), .status(503), .status(503), .status(200)])
            return h.delays
        }
        #expect(delays(42) == delays(42))
        #expect(delays(42) != delays(43))
    }
}

// MARK: - Retry-After

@Suite struct ExchangeMachineRetryAfterTests {
    @Test(arguments: [503, 429])
    func retryAfterSeconds(status: Int) {
        var h = Harness(policy(retry: retry(limit: 2, scale: 50, statuses: [429, 503])))
        h.begin()
        #expect(h.machine.responseFields(for: status).contains(.retryAfter))
        let s = h.run([.status(status, retryAfter: "1"), .status(200)])
        #expect(h.delays == [1000])
        #expect(s.retries.first?.reason == "status \(status)")
    }

    @Test(arguments: [503, 429])
    func retryAfterHTTPDateUsesTheWallClock(status: Int) {
        // Sun, 06 Nov 1994 08:49:37 GMT is 784111777 s after the epoch; the head arrives 1.95 s before it.
        let clock = FakeClock(wall: 784_111_777_000 - 1950)
        var h = Harness(policy(retry: retry(limit: 2, scale: 50, statuses: [429, 503])), clock: clock)
        h.begin()
        h.run([.status(status, retryAfter: "Sun, 06 Nov 1994 08:49:37 GMT"), .status(200)])
        #expect(h.delays == [1950])
    }

    @Test func retryAfterIsCappedByMaxDelay() {
        var h = Harness(policy(retry: retry(limit: 2, scale: 50, maxDelay: 400)))
        h.begin()
        h.run([.status(503, retryAfter: "5"), .status(200)])
        #expect(h.delays == [400])
    }

    @Test func retryAfterIgnoredWhenDisabled() {
        var h = Harness(policy(retry: retry(limit: 2, scale: 100, retryAfter: false)))
        h.begin()
        h.run([.status(503, retryAfter: "2"), .status(200)])
        #expect(h.delays == [100])
    }

    @Test(arguments: [
        ("soon", 200), ("-5", 200), ("  ", 200), ("86401", 200), ("Thu, 01 Jan 1970 00:00:01 GMT", 0),
        (" 3 ", 3000),
    ])
    func unusableOrPastRetryAfter(value: String, delay: Int) {
        var h = Harness(policy(retry: retry(limit: 2, scale: 200)))
        h.begin()
        h.run([.status(503, retryAfter: value), .status(200)])
        #expect(h.delays == [delay], "Retry-After \(value)")
    }

    @Test func retryAfterOnlyOn429And503() {
        var h = Harness(policy(retry: retry(limit: 2, scale: 100)))
        h.begin()
        h.run([.status(502, retryAfter: "3"), .status(200)])
        #expect(h.delays == [100])
    }
}

// MARK: - Transport failures, per-try timeout, deadline

@Suite struct ExchangeMachineTransportTests {
    @Test func connectionRefusedIsRetriedThen502() {
        var h = Harness(policy(retry: retry(limit: 2, scale: 100)))
        h.begin()
        let s = h.run([.refused])
        #expect(s.status == 502 && s.outcome == .error && s.attempts == 3)
        #expect(s.error == "upstream api.test:80 refused the connection")
        #expect(s.retryStopped == .limit && s.retries.map(\.reason) == ["refused", "refused"])
        #expect(h.delays == [100, 200])
    }

    @Test func connectionRefusedNotRetriedWhenNotListed() {
        var h = Harness(policy(retry: retry(limit: 2, scale: 1000, errors: [.reset, .timeout])))
        h.begin()
        let s = h.run([.refused])
        #expect(s.attempts == 1 && s.status == 502 && s.retryStopped == nil)
    }

    @Test(arguments: [TransportErrorKind.reset, .dns, .tls, .timeout])
    func listedTransportKindsAreRetried(kind: TransportErrorKind) {
        var h = Harness(policy(retry: retry(limit: 2, scale: 50)))
        h.begin()
        let s = h.run([.fail(kind, .upstreamProtocol(host: "api.test:80", reason: "x")), .status(200)])
        #expect(s.status == 200 && s.attempts == 2 && s.retries.first?.reason == kind.rawValue)
    }

    @Test func otherFailuresAndTrustFailuresAreNeverRetried() {
        var h = Harness(policy(retry: retry(limit: 2, scale: 1000, errors: [.tls, .reset, .refused, .dns, .timeout])))
        h.begin()
        let trust = ProxyError.trustFailure(host: "api.test:443", evaluator: "public_keys", reason: "public key pin mismatch")
        let s = h.run([.fail(.other, trust)])
        #expect(s.attempts == 1 && s.status == 502 && s.retries.isEmpty)
        #expect(s.trustFailure?.evaluator == "public_keys" && s.trustFailure?.reason == "public key pin mismatch")
        #expect(h.events.contains("event trust failed public_keys: public key pin mismatch"))
    }

    @Test func perTryTimeoutOnAStalledUpstream() {
        var h = Harness(policy(retry: retry(limit: 2, scale: 100, perTryTimeout: 500)))
        let start = h.clock.now
        h.begin()
        let s = h.run([.stall])
        #expect(h.tryTimeouts == [500, 500, 500] && h.delays == [100, 200])
        #expect(s.status == 504 && s.error == "upstream api.test:80 timed out (no response head in time)")
        #expect(s.retryStopped == .limit)
        #expect(h.clock.now - start == 3 * 500 + 100 + 200)
    }

    @Test func perTryTimeoutDefaultsToTheServers() {
        var h = Harness(policy(retry: retry(limit: 1, scale: 100)), perTryTimeout: 500)
        h.begin()
        h.run([.stall])
        #expect(h.tryTimeouts == [500, 500])
    }

    @Test func deadlineCutsTheLastTryAndStopsRetriesWith504() {
        // per-try 1 s, deadline 1.5 s: try 1 times out at 1.0 s, try 2 starts at 1.1 s and is
        // cut off by the deadline at 1.5 s.
        var h = Harness(policy(retry: retry(limit: 5, scale: 100, perTryTimeout: 1000, deadline: 1500)))
        let start = h.clock.now
        h.begin()
        let s = h.run([.stall])
        #expect(h.tryTimeouts == [1000, 400])
        #expect(h.clock.now - start == 1500)
        #expect(s.status == 504 && s.attempts == 2 && s.retryStopped == .deadline)
        #expect(s.error == "upstream api.test:80 timed out (no response head in time)")
    }

    @Test func deadlineCountsBackoffDelays() {
        // fast 503s, delays 400 then 800 ms, deadline 1 s: the third try would start at 1.2 s
        var h = Harness(policy(retry: retry(limit: 5, scale: 400, deadline: 1000)))
        h.begin()
        let s = h.run([.status(503)])
        #expect(s.attempts == 2 && s.retryStopped == .deadline && s.status == 503)
        #expect(h.delays == [400])
    }

    @Test func deadlinePassedBeforeATryIs504WithItsPhase() {
        // the retry fits the deadline when decided (900 + 50 < 1000), but its timer fires late
        var h = Harness(policy(retry: retry(limit: 2, scale: 50, deadline: 1000)))
        h.tryDuration = 900
        h.timerLag = 300
        h.begin()
        let s = h.run([.refused])
        #expect(s.status == 504 && s.outcome == .error && s.attempts == 1)
        #expect(s.error == "upstream api.test:80 timed out (retry deadline passed)")
        #expect(h.log.contains("fail 504 upstream api.test:80 timed out (retry deadline passed)"))
        #expect(h.tryTimeouts.count == 1, "no try starts past the deadline")
    }
}

// MARK: - Budget and body replay

@Suite struct ExchangeMachineBudgetTests {
    /// One failing request after another on one policy (whose budget they share), all at `at`.
    func failing(
        _ policy: HostPolicy, _ n: Int, at clock: FakeClock, target: ExchangeMachine.Target = origin
    ) -> [ExchangeSummary] {
        (0..<n).map { _ in
            var h = Harness(policy, target: target, clock: clock)
            h.begin()
            let s = h.run([.status(503)])
            clock.now -= h.delays.reduce(0, +)  // keep every request within the same second
            return s
        }
    }

    @Test func defaultBudgetAllowsMinPerSecond() {
        // ratio 0.2, min_per_second 3: 6 failing requests within one second get 3 retries
        let p = policy(retry: retry(limit: 1, scale: 20, budget: RetryPolicy.defaultBudget))
        let clock = FakeClock(now: 5_030)
        let lines = failing(p, 6, at: clock)
        #expect(lines.map { $0.attempts - 1 }.reduce(0, +) == 3)
        #expect(lines.map(\.retryStopped) == [.limit, .limit, .limit, .budget, .budget, .budget])
    }

    @Test func ratioWinsOverTheMinimumWithEnoughTraffic() {
        let p = policy(retry: retry(limit: 1, scale: 20, budget: .init(ratio: 0.5, minPerSecond: 1)))
        let budget = p.retryBudgets!.budget(for: "api.test")
        for _ in 0..<10 { budget.recordRequest(now: 7_100) }
        // 10 recorded + 1 per exchange: at the k-th failure, max(1, 0.5 × (10 + k)) allowed
        let lines = failing(p, 8, at: FakeClock(now: 7_200))
        #expect(lines.map { $0.attempts - 1 }.reduce(0, +) == 8)
        #expect(budget.tryAcquireRetry(now: 7_900) == true)  // 18 requests → 9 retries
        #expect(budget.tryAcquireRetry(now: 7_900) == false)
    }

    @Test func budgetWindowIsOneSecondOfTheInjectedTime() {
        let p = policy(retry: retry(limit: 1, scale: 20, budget: .init(ratio: 0.1, minPerSecond: 2)))
        let clock = FakeClock(now: 3_000)
        #expect(failing(p, 4, at: clock).map(\.retryStopped) == [.limit, .limit, .budget, .budget])
        clock.now = 4_010  // the next second: a fresh window
        #expect(failing(p, 1, at: clock).map(\.attempts) == [2])
    }

    @Test func budgetIsPerHost() {
        let p = policy(retry: retry(limit: 1, scale: 20, budget: .init(ratio: 0.1, minPerSecond: 2)))
        let clock = FakeClock(now: 3_000)
        #expect(failing(p, 4, at: clock).map { $0.attempts - 1 }.reduce(0, +) == 2)
        let other = ExchangeMachine.Target(host: "localhost", port: 80, url: "http://localhost/x")
        #expect(failing(p, 1, at: clock, target: other).map(\.attempts) == [2])
    }

    @Test func bodyBeyondTheBufferLimitStopsWithBufferLimit() {
        var h = Harness(policy(retry: retry(limit: 2, scale: 50, methods: ["POST"])), method: "POST")
        h.canResendBody = false
        h.begin()
        let s = h.run([.status(503)])
        #expect(s.attempts == 1 && s.retryStopped == .bufferLimit && s.status == 503)
        #expect(h.events.contains("event retry stopped: buffer_limit"))
        // within the limit, the same policy retries
        var small = Harness(policy(retry: retry(limit: 2, scale: 50, methods: ["POST"])), method: "POST")
        small.begin()
        #expect(small.run([.status(503), .status(200)]).attempts == 2)
    }

    @Test func transportFailureWithABodyBeyondTheLimit() {
        var h = Harness(policy(retry: retry(limit: 2, scale: 50)), method: "PUT")
        h.canResendBody = false
        h.begin()
        let s = h.run([.reset])
        #expect(s.attempts == 1 && s.retryStopped == .bufferLimit && s.status == 502)
    }

    @Test func whatIsReadWholeBeforeTheFirstTry() {
        let retrying = ExchangeMachine(
            summary: ExchangeSummary(id: 1, client: "c", method: "PUT", url: "u", policy: "p"),
            policy: policy(retry: retry()), target: origin, defaultPerTryTimeout: 1, monitoring: .none)
        #expect(retrying.readsBodyWhole(length: 1000))
        #expect(!retrying.readsBodyWhole(length: Int64(RetryPolicy.defaultBufferLimit) + 1))
        #expect(!retrying.readsBodyWhole(length: 0))
        let post = ExchangeMachine(
            summary: ExchangeSummary(id: 1, client: "c", method: "POST", url: "u", policy: "p"),
            policy: policy(retry: retry()), target: origin, defaultPerTryTimeout: 1, monitoring: .none)
        #expect(!post.readsBodyWhole(length: 1000), "POST is not retried, so not kept")
        let challenged = ExchangeMachine(
            summary: ExchangeSummary(id: 1, client: "c", method: "POST", url: "u", policy: "p"),
            policy: policy(credentials: Credentials(username: "u", password: Secret("p"))),
            target: origin, defaultPerTryTimeout: 1, monitoring: .none)
        #expect(challenged.readsBodyWhole(length: 1000), "a credentials challenge resends it")
        #expect(ExchangeMachine.replayLimit(for: policy()) == 0)
        #expect(ExchangeMachine.replayLimit(for: policy(redirect: .follow)) == 1 << 20)
        #expect(ExchangeMachine.replayLimit(for: policy(retry: retry(), credentials: nil)) == RetryPolicy.defaultBufferLimit)
    }
}

// MARK: - Validation

@Suite struct ExchangeMachineValidationTests {
    @Test func validationFailureIsRetriedThenTheLastResponsePassesUnchanged() {
        var h = Harness(policy(retry: retry(limit: 2, scale: 50), validate: ResponseValidator(statuses: [200...299])))
        h.begin()
        let s = h.run([.status(404)])
        #expect(s.status == 404 && s.attempts == 3 && s.retryStopped == .limit && s.outcome == .ok)
        #expect(s.validation == "status 404 is not acceptable")
        #expect(s.retries.first?.reason == "validation: status 404 is not acceptable")
        #expect(h.log.filter { $0 == "send" }.count == 1)
    }

    @Test func switchingProtocolsIsNeverValidatedOrRetried() {
        var h = Harness(policy(retry: retry(limit: 2, scale: 50), validate: ResponseValidator(statuses: [200...299])))
        h.begin()
        let s = h.run([.status(101)])
        #expect(s.status == 101 && s.attempts == 1 && s.validation == nil && s.retries.isEmpty)
        #expect(h.log.filter { $0 == "send" }.count == 1 && !h.log.contains("discard"))
    }

    @Test func validationWithoutRetryPassesTheResponseAndRecordsIt() {
        var h = Harness(policy(validate: ResponseValidator(statuses: [200...299, 304...304])))
        h.begin()
        let s = h.run([.status(500)])
        #expect(s.status == 500 && s.attempts == 1 && s.validation == "status 500 is not acceptable")
    }

    @Test func contentTypeIsRetriedUntilItMatches() {
        var h = Harness(
            policy(
                retry: retry(limit: 2, scale: 50),
                validate: ResponseValidator(statuses: [200...299], contentTypes: ["application/json"])))
        h.begin()
        #expect(h.machine.responseFields(for: 200) == .contentType)
        let s = h.run([.status(200, contentType: "text/html"), .status(200, contentType: "application/json")])
        #expect(s.attempts == 2 && s.validation == nil)
    }

    @Test func aValidResponseLeavesNoValidationReason() {
        var h = Harness(policy(retry: retry(), validate: ResponseValidator(statuses: [200...299], contentTypes: ["text/*"])))
        h.begin()
        let s = h.run([.status(200, contentType: "text/plain; charset=utf-8")])
        #expect(s.validation == nil && s.attempts == 1)
    }

    @Test func bodilessResponsesFailingValidationAreRetried() {
        var h = Harness(policy(retry: retry(limit: 1, scale: 50), validate: ResponseValidator(statuses: [200...299])))
        h.begin()
        #expect(h.run([.status(304), .status(200)]).attempts == 2)
    }
}

// MARK: - Redirects

@Suite struct ExchangeMachineRedirectTests {
    func follow(
        _ redirect: Redirector, _ upstream: [Upstream], model: ProxyRequest = get(),
        canResendBody: Bool = true
    ) -> Harness {
        var h = Harness(policy(redirect: redirect), method: model.method)
        h.canResendBody = canResendBody
        #expect(h.machine.needsRequestModel)
        h.begin(model: model)
        h.run(upstream)
        return h
    }

    @Test func doNotFollowPassesThe3xx() {
        var h = Harness(policy())
        #expect(!h.machine.needsRequestModel)
        h.begin()
        #expect(h.machine.responseFields(for: 302).isEmpty, "Location is not even read")
        let s = h.run([.status(302, location: "/elsewhere")])
        #expect(s.status == 302 && s.redirects == 0)
    }

    @Test func followsRelativeRedirectsToTheFinal200() {
        let h = follow(
            .follow,
            [
                .status(302, location: "/relative-redirect/2"), .status(302, location: "/relative-redirect/1"),
                .status(302, location: "/get"), .status(200),
            ])
        let s = h.machine.summary
        #expect(s.status == 200 && s.redirects == 3 && s.attempts == 4)
        #expect(h.machine.model?.url == "http://api.test/get")
        #expect(
            h.events.filter { $0.hasPrefix("event redirect") } == [
                "event redirect 302 to http://api.test/relative-redirect/2 hop 1",
                "event redirect 302 to http://api.test/relative-redirect/1 hop 2",
                "event redirect 302 to http://api.test/get hop 3",
            ])
    }

    @Test func pastMaxTheLast3xxGoesToTheClient() {
        let h = follow(
            Redirector(behavior: .follow(max: 2)),
            [
                .status(302, location: "/a"), .status(302, location: "/b"),
                .status(302, location: "/get"),
            ])
        #expect(h.machine.summary.status == 302 && h.machine.summary.redirects == 2 && h.machine.summary.attempts == 3)
    }

    @Test(arguments: [303, 302, 301])
    func postBecomesGetWithoutBody(code: Int) {
        let post = get(method: "POST", body: .length(11), fields: [.contentType: "text/plain"])
        var h = Harness(policy(redirect: .follow), method: "POST")
        h.begin(model: post)
        _ = h.feed(.tryStarting(origin))
        let next = h.feed(.responseHead(.init(status: code, location: "/anything/after"), canResendBody: false))
        guard case .checkRedirect(let request)? = next.command else {
            Issue.record("not followed: \(next.map(describe))")
            return
        }
        #expect(request.method == "GET" && request.body == .none && request.headerFields[.contentType] == nil)
        #expect(request.url == "http://api.test/anything/after")
    }

    @Test func a303AfterPutBecomesGet() {
        let h = follow(.follow, [.status(303, location: "/anything"), .status(200)], model: get(method: "PUT", body: .length(8)))
        #expect(h.machine.model?.method == "GET" && h.machine.model?.body == ProxyRequest.Body.none)
    }

    @Test(arguments: [(307, "POST"), (308, "PUT")])
    func a307Or308KeepsTheMethodAndNeedsTheBodyAgain(code: Int, method: String) {
        let h = follow(
            .follow, [.status(code, location: "/anything/replay"), .status(200)],
            model: get(method: method, body: .length(14_000)))
        #expect(h.machine.summary.status == 200 && h.machine.model?.method == method)
        // a body that cannot be sent again (over 1 MiB): the 3xx goes to the client
        let big = follow(
            .follow, [.status(code, location: "/anything"), .status(200)],
            model: get(method: method, body: .length(1_572_864)), canResendBody: false)
        #expect(big.machine.summary.status == code && big.machine.summary.redirects == 0)
    }

    @Test func crossHostDropsAuthorizationCookieAndCredentials() {
        let fields: HTTPFields = [.authorization: "Bearer cross-host", .cookie: "session=abc", HTTPField.Name("X-Keep")!: "yes"]
        var h = Harness(policy(redirect: .follow, credentials: Credentials(username: "u", password: Secret("p"))))
        h.begin(model: get(fields: fields))
        h.feed(.tryStarting(origin))
        let check = h.feed(.responseHead(.init(status: 302, location: "http://localhost:8080/headers"), canResendBody: true))
        guard case .checkRedirect(let next)? = check.command else {
            Issue.record("not followed")
            return
        }
        #expect(next.headerFields[.authorization] == nil && next.headerFields[.cookie] == nil)
        #expect(next.headerFields[HTTPField.Name("X-Keep")!] == "yes")
        #expect(h.feed(.redirectTarget(usable: true)).map(describe).last == "follow, credentials dropped")
    }

    @Test func sameHostKeepsAuthorizationCookieAndCredentials() {
        for location in ["/headers", "http://api.test/headers"] {
            let fields: HTTPFields = [.authorization: "Bearer same-host", .cookie: "session=abc"]
            var h = Harness(policy(redirect: .follow))
            h.begin(model: get(fields: fields))
            h.feed(.tryStarting(origin))
            let check = h.feed(.responseHead(.init(status: 302, location: location), canResendBody: true))
            guard case .checkRedirect(let next)? = check.command else {
                Issue.record("not followed")
                return
            }
            #expect(next.headerFields[.authorization] == "Bearer same-host" && next.headerFields[.cookie] == "session=abc")
            #expect(h.feed(.redirectTarget(usable: true)).map(describe).last == "follow, credentials kept")
        }
    }

    @Test func modifyRewritesTheLocation() {
        let rules = [
            Redirector.Rewrite(from: "http://nowhere.invalid", to: "http://also-nowhere.invalid"),
            Redirector.Rewrite(from: "http://localhost:8080", to: "http://api.test"),
        ]
        let h = follow(
            Redirector(behavior: .modify(max: 3, rewrites: rules)),
            [.status(302, location: "http://localhost:8080/anything/landed"), .status(200)],
            model: get(fields: [.authorization: "Bearer kept"]))
        #expect(h.machine.model?.url == "http://api.test/anything/landed")
        #expect(h.machine.model?.headerFields[.authorization] == "Bearer kept")
        #expect(h.log.contains("follow, credentials kept"))
    }

    @Test func nonHTTPLocationIsNotFollowed() {
        let h = follow(.follow, [.status(302, location: "ftp://127.0.0.1/file")])
        #expect(h.machine.summary.status == 302 && h.machine.summary.redirects == 0)
    }

    @Test func aTargetTheIOCannotRequestIsPassedOn() {
        var h = Harness(policy(redirect: .follow))
        h.begin(model: get())
        h.feed(.tryStarting(origin))
        h.feed(.responseHead(.init(status: 302, location: "http://user@elsewhere/"), canResendBody: true))
        #expect(h.feed(.redirectTarget(usable: false)).map(describe) == ["send"])
        #expect(h.machine.summary.redirects == 0 && !h.events.contains { $0.hasPrefix("event redirect") })
    }
}

// MARK: - Adapters, OAuth 2 refresh on 401

@Suite struct ExchangeMachineAdapterTests {
    @Test func oauth2RefreshOn401RetriesOnceWithAFreshToken() {
        let oauth = OAuth2Authenticator(
            settings: .init(
                grant: .clientCredentials, tokenURL: "http://auth.test/token",
                clientID: "sluice", clientSecret: Secret("s")))
        var h = Harness(policy(adapters: [oauth]), method: "PUT")
        #expect(h.machine.needsRequestModel)
        h.feed(.received)
        let first = h.feed(.prepare(model: get(method: "PUT", body: .length(51_200))))
        #expect(first.map(describe) == ["adapt PUT http://api.test/x"])
        h.feed(.adaptationSuspended)  // the first token is being fetched
        guard case .awaitingCredential(retry: false) = h.machine.state else {
            Issue.record("\(h.machine.state)")
            return
        }
        h.feed(.adapted(stamp("t1")(get(method: "PUT", body: .length(51_200)))))
        var tokens = ["t2"]
        let s = h.run(
            [.status(401), .status(200)],
            adapt: { request in
                #expect(request.headerFields[.authorization] == nil, "the retry adapts the request as it was before adaptation")
                return stamp(tokens.removeFirst())(request)
            })
        #expect(s.status == 200 && s.attempts == 2 && s.retryStopped == nil)
        #expect(h.delays == [0])
        #expect(
            h.events == [
                "event received PUT http://api.test/x default",
                "event adapted oauth2",
                "event try 1 PUT http://api.test/x [Bearer t1]",
                "event retrying 1 after 0 (status 401)",
                "event metrics 1",
                "event try 2 PUT http://api.test/x [Bearer t2]",
                "event response 200 on try 2",
                "event metrics 2",
                "event finished 200 ok attempts 2",
            ])
    }

    @Test func oauth2RetriesOnlyOnce() {
        let oauth = OAuth2Authenticator(
            settings: .init(
                grant: .clientCredentials, tokenURL: "http://auth.test/token",
                clientID: "sluice", clientSecret: Secret("s")))
        var h = Harness(policy(adapters: [oauth]))
        h.begin(model: get(), adapt: stamp("t1"))
        let s = h.run([.status(401)], adapt: stamp("t2"))
        #expect(s.status == 401 && s.attempts == 2 && s.retryStopped == nil)
    }

    @Test func oauth2RefreshNeedsTheBodyAgain() {
        let oauth = OAuth2Authenticator(
            settings: .init(
                grant: .clientCredentials, tokenURL: "http://auth.test/token",
                clientID: "sluice", clientSecret: Secret("s")))
        var h = Harness(policy(adapters: [oauth]), method: "POST")
        h.canResendBody = false
        h.begin(model: get(method: "POST", body: .streamed), adapt: stamp("t1"))
        let s = h.run([.status(401)])
        #expect(s.status == 401 && s.attempts == 1 && s.retryStopped == .bufferLimit)
    }

    @Test func aFailedReadaptationEndsWith502() {
        let oauth = OAuth2Authenticator(
            settings: .init(
                grant: .clientCredentials, tokenURL: "http://auth.test/token",
                clientID: "sluice", clientSecret: Secret("s")))
        var h = Harness(policy(adapters: [oauth]))
        h.begin(model: get(), adapt: stamp("t1"))
        let s = h.run(
            [.status(401)], adapt: { _ in .failure(AdaptationError(adapter: "oauth2", reason: "token endpoint answered 500")) })
        #expect(s.status == 502 && s.outcome == .error && s.attempts == 1)
        #expect(s.error == "adapter oauth2 failed: token endpoint answered 500")
        #expect(h.events.contains("event adaptation failed oauth2: token endpoint answered 500"))
    }

    @Test func adapterFailureSendsNothingUpstream() {
        var h = Harness(policy(adapters: [BearerAdapter(token: Secret("x")), HeaderAdapter()]), monitoring: .detailedEvents)
        h.feed(.received)
        h.feed(.prepare(model: get()))
        let actions = h.feed(.adapted(.failure(AdaptationError(adapter: "guard", reason: "path is not allowed"))))
        #expect(
            actions.map(describe) == [
                "event adaptation failed guard: path is not allowed",
                "fail 502 adapter guard failed: path is not allowed",
            ])
        h.end(.adapterFailed(name: "guard", reason: "path is not allowed"))
        #expect(h.machine.summary.attempts == 0 && h.machine.isFinished)
    }

    @Test func fixedHeaderEditsNeedNoModel() {
        var h = Harness(policy(adapters: [BearerAdapter(token: Secret("x"))]))
        #expect(!h.machine.needsRequestModel)
        h.feed(.received)
        #expect(h.feed(.prepare(model: nil)).map(describe) == ["event adapted bearer", "forward with header edits"])
        // a monitor that reads requests needs the model, and the adapters then run on it
        let detailed = Harness(policy(adapters: [BearerAdapter(token: Secret("x"))]), monitoring: .detailedEvents)
        #expect(detailed.machine.needsRequestModel)
    }
}

// MARK: - The client, events, allocation-free shape

@Suite struct ExchangeMachineLifecycleTests {
    @Test func clientGoneDuringBackoffStartsNoFurtherTry() {
        var h = Harness(policy(retry: retry(limit: 2, scale: 600)))
        h.begin()
        h.feed(.tryStarting(origin))
        h.feed(.responseHead(.init(status: 503), canResendBody: true))
        h.feed(.tryEnded(TryTimings()))
        h.feed(.discardedDrained)
        guard case .backingOff(let until) = h.machine.state else {
            Issue.record("\(h.machine.state)")
            return
        }
        #expect(until == h.clock.now + 600)
        h.clock.advance(200)
        #expect(h.feed(.ended(.clientAborted, error: nil)).map(describe) == ["event finished 0 client_aborted attempts 1"])
        h.clock.advance(1400)
        #expect(h.feed(.retryTimerFired).isEmpty)
        #expect(h.feed(.tryStarting(origin)).isEmpty)
        #expect(h.machine.summary.attempts == 1 && h.machine.summary.outcome == .clientAborted)
        #expect(h.feed(.ended(.error, error: "late")).isEmpty, "finished is reported once")
    }

    @Test func anOriginsLearnedPauseIsWaitedOutAtMostThreeTimes() {
        func commands(_ actions: ExchangeMachine.Actions) -> [String] {
            actions.map(describe).filter { !$0.hasPrefix("event") }
        }
        // No retry policy: the pause the rate limit learned is not a failure to retry.
        var h = Harness(policy())
        h.begin()
        for attempt in 1...3 {
            h.feed(.tryStarting(origin))
            #expect(commands(h.feed(.heldByOrigin(.init(status: 429), canResendBody: true))) == ["discard"])
            h.feed(.tryEnded(TryTimings()))
            #expect(commands(h.feed(.discardedDrained)) == ["retry after 0"])
            #expect(h.machine.summary.retries.last?.reason == "rate_limit 429" && h.machine.summary.retries.count == attempt)
            h.feed(.retryTimerFired)
        }
        h.feed(.tryStarting(origin))
        #expect(commands(h.feed(.heldByOrigin(.init(status: 429), canResendBody: true))) == ["send"])
        // A 503 is waited out only for a method that may be repeated; a body that cannot be
        // sent again never is.
        var post = Harness(policy(), method: "POST")
        post.begin()
        post.feed(.tryStarting(origin))
        #expect(commands(post.feed(.heldByOrigin(.init(status: 503), canResendBody: true))) == ["send"])
        var body = Harness(policy())
        body.begin()
        body.feed(.tryStarting(origin))
        #expect(commands(body.feed(.heldByOrigin(.init(status: 429), canResendBody: false))) == ["send"])
    }

    @Test func exactEventSequenceOfARetriedThenSuccessfulExchange() {
        var h = Harness(policy(retry: retry(limit: 2, scale: 100)), monitoring: .detailedEvents)
        #expect(h.machine.needsRequestModel)
        h.begin(model: get())
        h.run([.status(503), .status(200)])
        #expect(
            h.log == [
                "event received GET http://api.test/x default",
                "forward",
                "event try 1 GET http://api.test/x",
                "begin try, 60000 ms for a head",
                "event retrying 1 after 100 (status 503)",
                "discard",
                "event metrics 1",
                "retry after 100",
                "build retry",
                "event try 2 GET http://api.test/x",
                "begin try, 60000 ms for a head",
                "send",
                "event response 200 on try 2",
                "event metrics 2",
                "event finished 200 ok attempts 2",
            ])
        let s = h.machine.summary
        #expect(s.retries == [RetryRecord(attempt: 1, delayMilliseconds: 100, reason: "status 503")])
        #expect(s.bytesOut == 10)
    }

    @Test func withoutMonitorsNoEventIsBuilt() {
        var h = Harness(policy(retry: retry(limit: 2, scale: 100)), monitoring: .none)
        h.begin()
        h.run([.status(503), .refused, .status(200)])
        #expect(h.events.isEmpty)
        #expect(
            h.log == [
                "forward", "begin try, 60000 ms for a head", "discard", "retry after 100", "build retry",
                "begin try, 60000 ms for a head", "retry after 200", "build retry",
                "begin try, 60000 ms for a head", "send",
            ])
        #expect(h.machine.summary.retries.count == 2, "the record is kept all the same")
    }

    @Test func onlyTheKindsTheMonitorsReadAreBuilt() {
        // An access log reads `.finished` (and tunnel and credential lines) alone.
        var h = Harness(policy(retry: retry(limit: 2, scale: 100)), events: [.finished, .tunnelClosed])
        h.begin()
        h.run([.status(503), .status(200)])
        #expect(h.log.filter { $0.hasPrefix("event") } == ["event finished 200 ok attempts 2"])
        var r = Harness(policy(retry: retry(limit: 1, scale: 100)), events: [.retrying, .retryStopped])
        r.begin()
        r.run([.status(503), .status(503)])
        #expect(
            r.log.filter { $0.hasPrefix("event") } == ["event retrying 1 after 100 (status 503)", "event retry stopped: limit"])
    }

    @Test func aCompositeMonitorHandsEachMonitorTheKindsItReads() {
        final class Recorder: EventMonitor {
            let events: ProxyEvent.Kinds
            var seen: [String] = []
            init(_ events: ProxyEvent.Kinds) { self.events = events }
            func handle(_ event: ProxyEvent) { seen.append(describe(event)) }
        }
        let finishedOnly = Recorder(.finished)
        let everything = Recorder(.all)
        let composite = CompositeEventMonitor([finishedOnly, everything])
        #expect(composite.events == .all)
        composite.handle(.requestReceived(id: 1, client: "c", method: "GET", url: "http://a/", policy: "default"))
        composite.handle(.finished(ExchangeSummary(id: 1, client: "c", method: "GET", url: "http://a/", policy: "default")))
        #expect(finishedOnly.seen.count == 1 && finishedOnly.seen[0].hasPrefix("event finished"))
        #expect(everything.seen.count == 2)
        #expect(CompositeEventMonitor([Recorder(.finished), Recorder(.tryStarted)]).events == [.finished, .tryStarted])
    }

    @Test func plainRequestAsksForNoResponseFields() {
        let h = Harness(policy())
        for status in [200, 204, 302, 404, 503] { #expect(h.machine.responseFields(for: status).isEmpty) }
    }

    @Test func tunnelsReportTunnelClosed() {
        var h = Harness(policy(), method: "CONNECT")
        h.feed(.received)
        h.machine.summary.status = 200
        #expect(h.feed(.ended(.tunnel, error: nil)).map(describe) == ["event tunnel closed"])
    }

    @Test func eventsOutOfTurnAreIgnored() {
        var h = Harness(policy(retry: retry()))
        #expect(h.feed(.responseHead(.init(status: 503), canResendBody: true)).isEmpty)
        #expect(h.feed(.retryTimerFired).isEmpty)
        #expect(h.feed(.discardedDrained).isEmpty)
        #expect(h.feed(.redirectTarget(usable: true)).isEmpty)
        h.begin()
        #expect(h.feed(.prepare(model: nil)).isEmpty, "the pipeline runs once")
        #expect(h.machine.summary.attempts == 0)
    }

    @Test func actionsHoldUpToTheirCapacity() {
        // the most one event asks for: a trust failure's event, the retry's event, the backoff
        var h = Harness(policy(retry: retry(errors: [.other])))
        h.begin()
        h.feed(.tryStarting(origin))
        let actions = h.feed(.tryFailed(.trustFailure(host: "h", evaluator: "e", reason: "r"), kind: .other, canResendBody: true))
        #expect(actions.map(describe) == ["event trust failed e: r", "event retrying 1 after 100 (other)", "retry after 100"])
        #expect(actions.count <= ExchangeMachine.Actions.capacity)
        #expect(actions.command.map(describe) == "retry after 100")
    }
}

@Suite struct TypedReasonTests {
    @Test func stopReasonsPrintTheAccessLogWords() {
        #expect(RetryStopReason.allCases.map(\.rawValue) == ["limit", "budget", "deadline", "method", "buffer_limit"])
    }

    @Test func timeoutPhasesPrintTheErrorBodyWords() {
        #expect(
            TimeoutPhase.allCases.map(\.rawValue)
                == ["connect", "transfer", "no response head in time", "retry deadline passed", "token request"])
        #expect(
            ProxyError.upstreamTimeout(host: "h:80", phase: .noResponseHead).message
                == "upstream h:80 timed out (no response head in time)")
    }

    @Test func retryAfterParses() {
        #expect(RetryAfter("120") == .delay(milliseconds: 120_000))
        #expect(RetryAfter("Sun, 06 Nov 1994 08:49:37 GMT") == .date(epochSeconds: 784_111_777))
        #expect(RetryAfter("Sun, 06 Nov 1994 08:49:37 GMT")?.milliseconds(wallClockNow: 784_111_777_000 + 5) == 0)
        // the obsolete forms a recipient must accept (RFC 9110 §5.6.7), and no impossible date
        #expect(RetryAfter("Sunday, 06-Nov-94 08:49:37 GMT") == .date(epochSeconds: 784_111_777))
        #expect(RetryAfter("Sun Nov  6 08:49:37 1994") == .date(epochSeconds: 784_111_777))
        #expect(RetryAfter("Sun, 06 Nov 1994 25:49:37 GMT") == nil)
        #expect(RetryAfter("86401") == nil && RetryAfter("soon") == nil && RetryAfter("-5") == nil && RetryAfter("") == nil)
    }
}

import HTTPTypes
import Testing

@testable import SluiceCore

/// A hook call that waits (`LuaWait`, `sluice.http`): it yields its coroutine, resumes with the
/// answer, keeps its budgets across the wait, is stopped by its wall-clock timer (a late answer
/// then ignored), and cannot wait across a C boundary. A fake `LuaHost` answers by hand.
@Suite struct LuaWaitTests {
    /// Keeps what was asked; the test answers and fires timers.
    final class FakeHost: LuaHost {
        var requests: [LuaSubrequest] = []
        var pending: [(Result<LuaSubresponse, LuaOperationError>) -> Void] = []
        var timers: [(microseconds: Int64, fired: () -> Void)] = []
        var cancelled = 0
        /// Answers each sub-request inside the call that starts it.
        var answerAtOnce: Result<LuaSubresponse, LuaOperationError>?

        final class Operation: LuaOperation {
            let host: FakeHost
            init(_ host: FakeHost) { self.host = host }
            func cancel() { host.cancelled += 1 }
        }

        func subrequest(
            _ request: LuaSubrequest, completion: @escaping (Result<LuaSubresponse, LuaOperationError>) -> Void
        ) -> any LuaOperation {
            requests.append(request)
            if let answer = answerAtOnce { completion(answer) } else { pending.append(completion) }
            return Operation(self)
        }

        func timer(microseconds: Int64, _ fired: @escaping () -> Void) -> any LuaOperation {
            timers.append((microseconds, fired))
            return Operation(self)
        }

        /// A fleet's table: keeps each operation for the test to answer.
        final class Store: LuaSharedStore {
            var asked: [LuaSharedOperation] = []
            var pending: [(Result<LuaSharedMemory.Value?, LuaSharedMemory.Failure>) -> Void] = []
            /// Answers each operation inside the call that starts it (a Redis that is down).
            var answerAtOnce: Result<LuaSharedMemory.Value?, LuaSharedMemory.Failure>?
            func perform(
                _ operation: LuaSharedOperation,
                completion: @escaping (Result<LuaSharedMemory.Value?, LuaSharedMemory.Failure>) -> Void
            ) {
                asked.append(operation)
                if let answer = answerAtOnce { completion(answer) } else { pending.append(completion) }
            }
        }
        var store: Store?
        var shared: (any LuaSharedStore)? { store }

        func refusal(host: String, port: Int) -> String? {
            port == 9901 ? "it is this Sluice's admin listener" : nil
        }

        func answer(_ status: Int, _ body: String = "", at index: Int = 0) {
            pending.remove(at: index)(
                .success(LuaSubresponse(status: status, headers: [("X-A", "1"), ("x-a", "2")], body: Array(body.utf8))))
        }
    }

    let allow = [try! LuaAllowedHost.parse("audit.test").get(), try! LuaAllowedHost.parse("other.test:8080").get()]

    /// Starts `on_request` with `body` as its body; the result lands in the returned box.
    func start(
        _ body: String, host: FakeHost, limits: LuaLimits = .default, state: LuaState? = nil, depth: Int = 0
    ) throws -> (LuaState, () -> (LuaRequestView, LuaCallResult)?) {
        let state = try state ?? LuaTest.load("return { on_request = function(req, ctx)\n\(body)\nend }", limits: limits)
        var outcome: (LuaRequestView, LuaCallResult)?
        state.makeExchange(limits: limits).onRequest(LuaTest.get(), waitingWith: host, allowHosts: allow, depth: depth) {
            outcome = ($0, $1)
        }
        return (state, { outcome })
    }

    @Test func aCallWaitsForItsSubrequestAndResumesWithTheAnswer() throws {
        let host = FakeHost()
        let (_, outcome) = try start(
            """
            local res, err = sluice.http{method = "POST", url = "http://audit.test/e", headers = {["X-K"] = "v"}, body = "b"}
            req.headers:set("x-status", tostring(res.status))
            req.headers:set("x-body", res.body)
            req.headers:set("x-a", res.headers["x-a"])
            """, host: host)
        #expect(outcome() == nil)
        #expect(host.requests.count == 1 && host.timers.count == 1)
        let sent = host.requests[0]
        #expect(sent.method == "POST" && sent.url == "http://audit.test/e" && sent.body == Array("b".utf8))
        #expect(sent.headers.contains { $0 == ("X-K", "v") } && sent.depth == 1)
        #expect(sent.timeoutMicroseconds <= 1_000_000)
        host.answer(201, "ok")
        let (request, result) = try #require(outcome())
        #expect(result.outcome == .ok, "\(result.outcome)")
        #expect(request.headers[HTTPField.Name("x-status")!] == "201")
        #expect(request.headers[HTTPField.Name("x-body")!] == "ok")
        #expect(request.headers[HTTPField.Name("x-a")!] == "1, 2")
        #expect(host.cancelled == 1)  // the wall-clock timer
    }

    @Test func aFailedSubrequestIsNilAndAMessage() throws {
        let host = FakeHost()
        host.answerAtOnce = .failure(LuaOperationError("connection refused"))
        let (_, outcome) = try start(
            "local res, err = sluice.http{url = 'http://audit.test/'}\nreq.headers:set('x-err', err)", host: host)
        let (request, result) = try #require(outcome())
        #expect(result.outcome == .ok, "\(result.outcome)")
        #expect(request.headers[HTTPField.Name("x-err")!] == "sluice.http: connection refused")
    }

    @Test func pcallCanWaitButACBoundaryCannot() throws {
        let host = FakeHost()
        let (_, ok) = try start(
            "local fine, res = pcall(sluice.http, {url = 'http://audit.test/'})\nreq.headers:set('x-s', tostring(res.status))",
            host: host)
        host.answer(204)
        #expect(try #require(ok()).1.outcome == .ok)
        // xpcall too, through Sluice's wrapper of it (its handler is metered: LuaLimitsTests).
        let (_, viaX) = try start(
            "local fine, res = xpcall(sluice.http, function(m) return m end, {url = 'http://audit.test/'})\n"
                + "req.headers:set('x-s', tostring(res.status))",
            host: host)
        host.answer(204)
        let (xRequest, xResult) = try #require(viaX())
        #expect(xResult.outcome == .ok, "\(xResult.outcome)")
        #expect(xRequest.headers[HTTPField.Name("x-s")!] == "204")
        for body in [
            "table.sort({3, 2, 1}, function(a, b) sluice.http{url = 'http://audit.test/'}; return a < b end)",
            "string.gsub('ab', '.', function(c) sluice.http{url = 'http://audit.test/'} end)",
            "tostring(setmetatable({}, {__tostring = function() sluice.http{url = 'http://audit.test/'}; return '' end}))",
            "local ok, e = pcall(table.sort, {2, 1}, function(a, b) sluice.http{url = 'http://audit.test/'} end)\nerror(e, 0)",
        ] {
            let (state, outcome) = try start(body, host: FakeHost())
            let result = try #require(outcome()).1
            #expect(result.outcome.message.contains("sluice.http cannot wait here"), "\(body): \(result.outcome)")
            #expect(!state.isPoisoned)
        }
    }

    @Test func unlistedHostsTheAdminListenerAndTheCapAreScriptErrors() throws {
        for (body, message) in [
            ("sluice.http{url = 'http://evil.test/'}", "evil.test is not in this entry's lua.allow_hosts"),
            ("sluice.http{url = 'http://other.test:8081/'}", "other.test:8081 is not in this entry's lua.allow_hosts"),
            ("sluice.http{url = 'http://user@audit.test/'}", "url must be absolute"),
            ("sluice.http{url = 'http://audit.test/', headers = {X = 'a\\r\\nB: c'}}", "header 'X' holds CR, LF or NUL"),
        ] {
            let (_, outcome) = try start(body, host: FakeHost())
            #expect(try #require(outcome()).1.outcome.message.contains(message), "\(body)")
        }
        let admin = try LuaAllowedHost.parse("127.0.0.1").get()
        let state = try LuaTest.load("return { on_request = function(req) sluice.http{url = 'http://127.0.0.1:9901/'} end }")
        var outcome: LuaCallResult?
        state.makeExchange().onRequest(LuaTest.get(), waitingWith: FakeHost(), allowHosts: [admin], depth: 0) { outcome = $1 }
        #expect(outcome?.outcome.message.contains("is refused: it is this Sluice's admin listener") == true)

        let host = FakeHost()
        host.answerAtOnce = .success(LuaSubresponse(status: 200, headers: [], body: []))
        let (_, capped) = try start(
            "for i = 1, 3 do sluice.http{url = 'http://audit.test/'} end", host: host,
            limits: LuaLimits(subrequests: 2))
        #expect(try #require(capped()).1.outcome.message.contains("limits.subrequests (2) reached"))
        #expect(host.requests.count == 2)

        let (_, deep) = try start("sluice.http{url = 'http://audit.test/'}", host: FakeHost(), depth: LuaSubrequest.maxDepth)
        #expect(try #require(deep()).1.outcome.message.contains("sub-request 2 deep"))
    }

    /// A sub-request's header fields are copied within the memory cap: one long string as the
    /// value of thousands of fields is small in the state, not as copies. Nothing is sent.
    @Test func aSubrequestsHeaderCopiesAreBoundedByTheMemoryCap() throws {
        let host = FakeHost()
        let (_, outcome) = try start(
            "local s = string.rep('v', 1 << 20) local h = {} for i = 1, 200 do h['X-' .. i] = s end "
                + "sluice.http{url = 'http://audit.test/', headers = h}", host: host)
        let result = try #require(outcome()).1
        #expect(result.outcome.limitKind == .memory, "\(result.outcome)")
        #expect(host.requests.isEmpty)
    }

    /// The depth header is read from this process's own sub-requests only: a client's value,
    /// with no token or a guessed one, is depth 0, so it cannot stop a script's `sluice.http`.
    @Test func aDepthIsReadOnlyWithThisProcesssToken() {
        let token = LuaSubrequest.depthToken
        #expect(token.count == 32 && token.allSatisfy(\.isHexDigit))
        #expect(LuaSubrequest.headerValue(depth: 1) == "1 \(token)")
        #expect(LuaSubrequest.depth(fromHeader: Substring(LuaSubrequest.headerValue(depth: 1))) == 1)
        #expect(LuaSubrequest.depth(fromHeader: Substring(LuaSubrequest.headerValue(depth: 9))) == LuaSubrequest.maxDepth)
        for forged in ["2", "2 ", "2 0123456789abcdef0123456789abcdef", "2 \(token)x", "x \(token)", "-1 \(token)", ""] {
            #expect(LuaSubrequest.depth(fromHeader: Substring(forged)) == 0, "\(forged)")
        }
        // A fleet peer's signed request carries the depth alone.
        #expect(LuaSubrequest.depth(fromHeader: "2", anyToken: true) == 2)
        #expect(LuaSubrequest.depth(fromHeader: "-3", anyToken: true) == 0)
    }

    @Test func theWallClockCoversTheWaitAndALateAnswerIsIgnored() throws {
        let host = FakeHost()
        let (state, outcome) = try start(
            "sluice.http{url = 'http://audit.test/'}\nreq.headers:set('x-late', 'yes')", host: host)
        let timer = try #require(host.timers.first)
        #expect(timer.microseconds > 900_000 && timer.microseconds <= 1_000_000)
        timer.fired()
        let (request, result) = try #require(outcome())
        #expect(result.outcome.limitKind == .wall)
        #expect(result.outcome.message == "test.lua: wall-clock limit reached while waiting (limits.wall)")
        #expect(request == LuaTest.get())
        #expect(host.cancelled == 1)  // the sub-request
        host.answer(200)  // late: nothing runs
        #expect(!state.isPoisoned)
        // The state serves the next call, on the slot the stopped call gave back.
        var next = LuaTest.get()
        #expect(state.makeExchange().onRequest(&next).outcome.message.contains("sluice.http is for on_request"))
        #expect(state.slotCount == 1)
    }

    @Test func otherCallsRunWhileOneWaits() throws {
        let host = FakeHost()
        let state = try LuaTest.load(
            "return { on_request = function(req) local r = sluice.http{url = 'http://audit.test/' .. req.path}; req.headers:set('x-b', r.body) end }"
        )
        let (_, first) = try start("", host: host, state: state)
        let (_, second) = try start("", host: host, state: state)
        #expect(state.slotCount == 2 && host.pending.count == 2)
        host.answer(200, "second", at: 1)
        host.answer(200, "first")
        #expect(try #require(first()).0.headers[HTTPField.Name("x-b")!] == "first")
        #expect(try #require(second()).0.headers[HTTPField.Name("x-b")!] == "second")
    }

    /// A burst of calls waiting at once makes a slot each; once they end, the state keeps a
    /// few for its next calls and lets the rest go: its heap comes back near where it was,
    /// instead of holding the burst's coroutines against `limits.memory` for good. A slot
    /// made after the burst takes a retired one's index, and the calls still work.
    @Test func aBurstOfWaitingCallsDoesNotStayInTheHeap() throws {
        let host = FakeHost()
        let state = try LuaTest.load(
            "return { on_request = function(req) local r = sluice.http{url = 'http://audit.test/'}; req.headers:set('x-b', r.body) end }"
        )
        var done: [(LuaRequestView, LuaCallResult)] = []
        func wait() {
            state.makeExchange().onRequest(LuaTest.get(), waitingWith: host, allowHosts: allow, depth: 0) {
                done.append(($0, $1))
            }
        }
        wait()
        host.answer(200, "one")
        let baseline = state.memoryInUse
        for _ in 0..<300 { wait() }
        #expect(state.slotCount == 300 && host.pending.count == 300)
        let peak = state.memoryInUse
        while !host.pending.isEmpty { host.answer(200, "burst") }
        #expect(done.count == 301 && done.allSatisfy { $0.1.outcome == .ok })
        let after = state.memoryInUse
        #expect(peak > baseline + 300 * 1024, "\(peak) \(baseline)")
        #expect(after < baseline + 32 * 4 * 1024, "after \(after), baseline \(baseline), peak \(peak)")
        // The next calls reuse kept slots, then retired indexes: the slots made stay 300.
        for _ in 0..<40 { wait() }
        #expect(state.slotCount == 300)
        while !host.pending.isEmpty { host.answer(200, "again") }
        #expect(done.count == 341 && done.suffix(40).allSatisfy { $0.0.headers[HTTPField.Name("x-b")!] == "again" })
    }

    /// Another call stopped by a limit while one waits poisons the state for new calls only:
    /// the waiting call resumes in it with its answer and ends well, its `ctx.vars` read.
    @Test func aWaitingCallOutlivesAnotherCallsLimit() throws {
        let host = FakeHost()
        let state = try LuaTest.load(
            """
            return { on_request = function(req, ctx)
              if req.path == '/loop' then while true do end end
              local r = sluice.http{url = 'http://audit.test/'}
              req.headers:set('x-b', r.body)
              ctx.vars.answer = r.body
            end }
            """)
        var outcome: (LuaRequestView, LuaCallResult)?
        let exchange = state.makeExchange()
        exchange.onRequest(LuaTest.get(), waitingWith: host, allowHosts: allow, depth: 0) { outcome = ($0, $1) }
        var looping = LuaTest.get()
        looping.path = "/loop"
        let stopped = state.makeExchange().onRequest(&looping)
        #expect(stopped.outcome.limitKind == .instructions && state.isPoisoned, "\(stopped.outcome)")
        host.answer(200, "late")
        let (request, result) = try #require(outcome)
        #expect(result.outcome == .ok, "\(result.outcome)")
        #expect(request.headers[HTTPField.Name("x-b")!] == "late")
        #expect(exchange.vars() == ["answer": .string("late")])
        // A new call on the poisoned state is refused (the cache builds a fresh state for it).
        var next = LuaTest.get()
        #expect(state.makeExchange().onRequest(&next).outcome != .ok)
    }

    /// A `req` kept in a table of the script's top level while its call waits is not another
    /// call's to read or edit: only the running call's messages answer.
    @Test func aWaitingCallsRequestIsNotAnotherCallsToRead() throws {
        let host = FakeHost()
        let state = try LuaTest.load(
            """
            local kept = {}
            return { on_request = function(req)
              if kept.req == nil then
                kept.req = req
                sluice.http{url = 'http://audit.test/'}
              else
                local ok, seen = pcall(function() return kept.req.headers:get('x-secret') end)
                req.headers:set('x-seen', ok and tostring(seen) or 'refused')
                local edited = pcall(function() kept.req.headers:set('x-injected', '1') end)
                req.headers:set('x-edited', tostring(edited))
              end
            end }
            """)
        var secret = LuaTest.get()
        secret.headers[HTTPField.Name("x-secret")!] = "s3cr3t"
        var waiting: (LuaRequestView, LuaCallResult)?
        state.makeExchange().onRequest(secret, waitingWith: host, allowHosts: allow, depth: 0) { waiting = ($0, $1) }
        let (_, other) = try start("", host: host, state: state)
        let (seen, result) = try #require(other())
        #expect(result.outcome == .ok, "\(result.outcome)")
        #expect(seen.headers[HTTPField.Name("x-seen")!] == "refused")
        #expect(seen.headers[HTTPField.Name("x-edited")!] == "false")
        host.answer(200)
        let (first, _) = try #require(waiting)
        #expect(first.headers[HTTPField.Name("x-injected")!] == nil)
    }

    @Test func sharedWaitsForTheFleetsStore() throws {
        let host = FakeHost()
        let store = FakeHost.Store()
        host.store = store
        let (_, outcome) = try start(
            "local n = sluice.shared.incr('k', 2, 10)\nlocal v, err = sluice.shared.get('gone')\n"
                + "req.headers:set('x-n', tostring(n) .. ' ' .. tostring(v) .. ' ' .. err)", host: host)
        #expect(store.asked == [.incr("k", by: .integer(2), ttl: 10_000_000)])
        store.pending.removeFirst()(.success(.integer(7)))
        #expect(outcome() == nil && store.asked.count == 2)
        store.pending.removeFirst()(.failure(.unavailable("timed out")))
        let (request, result) = try #require(outcome())
        #expect(result.outcome == .ok, "\(result.outcome)")
        #expect(request.headers[HTTPField.Name("x-n")!] == "7 nil sluice.shared: timed out")
    }

    /// Waits answered at once (Redis down) in a loop: each resumes the coroutine from a loop,
    /// not from inside the call that yielded (the stack stays flat), and each is charged a
    /// period, so the loop stops at the instruction budget though it never reaches the hook.
    @Test func waitsAnsweredAtOnceInALoopStopAtTheBudget() throws {
        let host = FakeHost()
        let store = FakeHost.Store()
        store.answerAtOnce = .failure(.unavailable("the fleet's Redis is not available"))
        host.store = store
        let (_, outcome) = try start("while true do sluice.shared.get('k') end", host: host)
        let result = try #require(outcome()).1
        #expect(result.outcome.limitKind == .instructions, "\(result.outcome)")
        #expect(result.outcome.message.contains("instruction limit reached while waiting"), "\(result.outcome)")
        #expect(store.asked.count == LuaLimits.defaultInstructions / 1000)  // one period (1,000) a wait
    }

    @Test func allowHostsEntriesParse() {
        #expect((try? LuaAllowedHost.parse("API.test:8080").get())?.description == "api.test:8080")
        #expect((try? LuaAllowedHost.parse("[::1]:80").get())?.description == "[::1]:80")
        for bad in ["http://a.test", "a.test/x", "a.test:0", "a.test:99999", "", "u@a.test", "a test"] {
            #expect((try? LuaAllowedHost.parse(bad).get()) == nil, "\(bad)")
        }
    }
}

import HTTPTypes
import Synchronization
import Testing

@testable import SluiceCore

/// Each limit of `LuaLimits` stops the script it exists for; each test would fail (hang, crash
/// or pass the script) without its limit.
@Suite struct LuaLimitsTests {
    @Test func instructionBudgetStopsAnEndlessLoop() throws {
        let state = try LuaTest.load("return { on_request = function(req)\n  while true do end\nend }")
        var request = LuaTest.get()
        let result = state.makeExchange().onRequest(&request)
        #expect(result.outcome.limitKind == .instructions)
        #expect(result.outcome.message == "test.lua:2: instruction limit reached")
        #expect(result.instructions == LuaLimits.defaultInstructions)
        #expect(state.isPoisoned)
        #expect(request == LuaTest.get())
    }

    /// The outcome alone would not show it (a stop is sticky in the meter): nothing after the
    /// caught stop runs — no line is logged after a `pcall` returns, no header is set.
    @Test func pcallCannotSwallowAStop() throws {
        nonisolated(unsafe) var lines: [LuaLogLine] = []
        let state = try LuaState.load(
            LuaTest.script(
                "return { on_request = function(req)\n"
                    + "for i = 1, 10 do local ok = pcall(function() while true do end end) sluice.log.info('pcall returned', ok, i) end\n"
                    + "req.headers:set('x-done', 'yes')\nend }"), log: { lines.append($0) })
        var request = LuaTest.get()
        let result = state.makeExchange().onRequest(&request)
        #expect(result.outcome.limitKind == .instructions)
        #expect(lines.isEmpty, "\(lines.map(\.message))")
        #expect(request == LuaTest.get())
    }

    /// Lua runs `xpcall`'s message handler where the error is raised — for a stop, inside the
    /// count hook, where hooks are off. A handler that loops held the worker for good; it is
    /// not run for a stop (the call ends), and runs, metered, for any other error.
    @Test func xpcallsHandlerCannotOutrunAStop() throws {
        let stopped = try LuaTest.outcome("xpcall(function() while true do end end, function() while true do end end)")
        #expect(stopped.limitKind == .instructions, "\(stopped)")
        let handled = try LuaTest.evaluate(
            "select(2, xpcall(function() error('x', 0) end, function(m) return 'handled ' .. m end))")
        #expect(handled == .string("handled x"))
        let looping = try LuaTest.outcome("xpcall(function() error('x') end, function() while true do end end)")
        #expect(looping.limitKind == .instructions, "\(looping)")
    }

    @Test func wallClockStopsWhatTheInstructionBudgetAllows() throws {
        // Each read of the clock advances it by 1 ms: a 10 ms budget ends within a few hook periods.
        let ticks = Atomic<Int64>(0)
        let clock = LuaClock(monotonic: { ticks.add(1000, ordering: .relaxed).newValue })
        let limits = LuaLimits(instructions: 1 << 50, wall: .milliseconds(10))
        let state = try LuaTest.load("return { on_request = function(req) while true do end end }", limits: limits, clock: clock)
        var request = LuaTest.get()
        let result = state.makeExchange(limits: limits).onRequest(&request)
        #expect(result.outcome.limitKind == .wall)
        #expect(result.outcome.message == "test.lua:1: wall-clock limit reached")
        #expect(result.microseconds >= 10_000 && result.microseconds < 20_000)
    }

    @Test func stringBombIsRefusedByTheMemoryCap() throws {
        let state = try LuaTest.load("return { on_request = function(req) local s = string.rep('x', 1 << 30) end }")
        var request = LuaTest.get()
        let result = state.makeExchange().onRequest(&request)
        #expect(result.outcome.limitKind == .memory)
        #expect(result.peakMemory <= LuaLimits.defaultMemory)
        #expect(state.memoryInUse <= LuaLimits.defaultMemory)
    }

    /// The cap is on live data: garbage the collector has not reached yet is collected before
    /// the cap stops a call — at the allocator's first refusal, where Lua collects and asks
    /// again (a concatenation), or before a library function fills a buffer that would pass
    /// the cap (`rep`, `upper`). Two rounds' worth of each loop's strings exceed the 8 MiB cap,
    /// which stopped these calls at their second round when the first refusal stood.
    @Test(arguments: [
        ("local n = 0 for i = 1, 3 do local s = string.rep('x', 3000000) .. i n = n + #s end", "9000003"),
        ("local n = 0 for i = 1, 3 do local s = string.rep('x', 2500000):upper() n = n + #s end", "7500000"),
        ("local p = string.rep('x', 2000000) local n = 0 for i = 1, 3 do n = n + #(p .. p .. i) end", "12000003"),
    ])
    func garbageIsCollectedBeforeTheMemoryCapStopsACall(_ loop: String, _ total: String) throws {
        let (result, edited) = try LuaTest.onRequest(
            "return { on_request = function(req, ctx)\n\(loop)\nreq.headers:set('x-n', tostring(n))\nend }")
        #expect(result.outcome == .ok, "\(result.outcome)")
        #expect(edited.headers[HTTPField.Name("x-n")!] == total)
        #expect(result.peakMemory <= LuaLimits.defaultMemory)
    }

    /// A collection's work grows with the heap and the count hook does not see it: a call
    /// brings about 16 at most (`SLUICE_LUA_MAX_COLLECTIONS`), then a refusal stands. Here
    /// each of 100 rounds needs one (its garbage plus the live string pass the 1 MiB cap);
    /// without the bound the loop would end and the call succeed.
    @Test func aCallBringsAboutABoundedNumberOfCollections() throws {
        let limits = LuaLimits(instructions: 1 << 40, memory: 1 << 20)
        let outcome = try LuaTest.outcome(
            "local live = string.rep('a', 700000) for i = 1, 100 do local g = string.rep('b', 200000) .. i end",
            limits: limits)
        #expect(outcome.limitKind == .memory, "\(outcome)")
    }

    /// Live data past the cap is still refused: the strings of the loops above, kept.
    @Test func liveDataPastTheMemoryCapIsRefused() throws {
        let kept = try LuaTest.outcome("local t = {} for i = 1, 3 do t[i] = string.rep('x', 3000000) .. i end")
        #expect(kept.limitKind == .memory)
    }

    /// A refusal the collection cannot help stands: a `pcall` around it does not let the call
    /// go on, whether the refused allocation was Lua's own (a concatenation) or a library
    /// buffer's (`string.rep`, `string.upper`, `string.gsub`), which raises without Lua's
    /// collection and retry.
    @Test(arguments: [
        "local s = string.rep('x', 3000000) pcall(function() return s .. s .. s end)",
        "pcall(string.rep, 'x', 1 << 30)",
        "local s = string.rep('x', 3000000) local keep = s .. '!' pcall(string.upper, s)",
        "local s = string.rep('x', 3000000) pcall(string.gsub, s, '^', s)",
    ])
    func aCaughtMemoryRefusalStillStopsTheCall(_ body: String) throws {
        let (result, edited) = try LuaTest.onRequest(
            "return { on_request = function(req, ctx)\n\(body)\nreq.headers:set('x-after', 'pcall')\nend }")
        #expect(result.outcome.limitKind == .memory, "\(result.outcome)")
        #expect(edited == LuaTest.get())
    }

    @Test func concatenationBombIsRefusedByTheMemoryCap() throws {
        let outcome = try LuaTest.outcome("local s = 'x' for i = 1, 40 do s = s .. s end")
        #expect(outcome.limitKind == .memory)
    }

    @Test func tableGrowthIsRefusedByTheMemoryCap() throws {
        let limits = LuaLimits(instructions: 1 << 40, memory: 1 << 20)
        let outcome = try LuaTest.outcome("local t = {} for i = 1, 1e9 do t[i] = i end", limits: limits)
        #expect(outcome.limitKind == .memory)
    }

    @Test func deepRecursionIsAnErrorNotACrash() throws {
        let lua = try LuaTest.outcome("local function f(n) return f(n + 1) + 1 end\nreturn f(1)")
        #expect(!lua.isOK)
        #expect(lua.message.contains("stack overflow") || lua.limitKind == .memory)
        // Recursion through C (a metamethod calling itself) ends at Lua's C-stack limit.
        let c = try LuaTest.outcome(
            "local t = setmetatable({}, {}) getmetatable(t).__index = function(t, k) return t[k] end\nreturn t.x")
        #expect(!c.isOK)
        #expect(c.message.contains("stack overflow"))
    }

    @Test func bodyLimitRefusesALargerBody() throws {
        let limits = LuaLimits(body: 1024)
        let outcome = try LuaTest.outcome("req:set_body(string.rep('x', 1025))", limits: limits)
        #expect(outcome == .limit(.body, "test.lua:2: body of 1025 bytes is over limits.body (1024)"))
        #expect(try LuaTest.outcome("req:set_body(string.rep('x', 1024))", limits: limits).isOK)
    }

    @Test func aPoisonedStateIsRebuiltAndTheNextCallWorks() throws {
        let cache = LuaStateCache()
        let script = LuaTest.script(
            """
            return { on_request = function(req)
              if req.headers:get('x-spin') then while true do end end
              req.headers:set('x-ok', 'yes')
            end }
            """)
        let first = try cache.state(for: script)
        var spinning = LuaTest.get([HTTPField.Name("X-Spin")!: "1"])
        #expect(first.makeExchange().onRequest(&spinning).outcome.limitKind == .instructions)
        #expect(first.isPoisoned)
        #expect(first.makeExchange().onRequest(&spinning).outcome.message.contains("stopped by a limit"))

        let second = try cache.state(for: script)
        #expect(second !== first && !second.isPoisoned && cache.count == 1)
        var request = LuaTest.get()
        #expect(second.makeExchange().onRequest(&request).outcome == .ok)
        #expect(request.headers[HTTPField.Name("x-ok")!] == "yes")
    }

    @Test func theTopLevelRunsUnderTheBudgetsToo() {
        #expect(throws: LuaLoadError.self) { try LuaTest.load("while true do end") }
        #expect(throws: LuaLoadError.self) { try LuaTest.load("local s = string.rep('x', 1 << 30) return {}") }
    }
}

import Testing

@testable import SluiceCore

/// A worker's cache of states: one per script content, and after a reload only those of the
/// scripts the new configuration runs (`retain(only:)`, called by each worker as the new
/// configuration takes effect).
@Suite struct LuaStateCacheTests {
    /// `sluice_lua_memory_bytes` sums each state's report: its allocator's count after the load,
    /// and after each call that moved it by `memoryReportStep` or more (a call that allocates a
    /// little does not touch the shared counter). The sum itself is process-wide, shared with
    /// the suites running beside this one, so each state's share is what is checked here.
    @Test func aStateReportsItsMemoryAfterItsLoadAndAfterCallsThatMoveItFar() throws {
        let growing = try LuaTest.load(
            "local kept = {} return { on_log = function() kept[#kept + 1] = string.rep('x', 32768) .. #kept end }")
        #expect(growing.reportedMemory == Int(growing.meter.pointee.used))
        let loaded = growing.reportedMemory
        #expect(growing.makeExchange().onLog().outcome == .ok)
        #expect(growing.reportedMemory == Int(growing.meter.pointee.used))
        #expect(growing.reportedMemory >= loaded + 32768)

        let quiet = try LuaTest.load("local n = 0 return { on_log = function() n = n + 1 end }")
        let before = quiet.reportedMemory
        #expect(before > 0 && before == Int(quiet.meter.pointee.used))
        for _ in 0..<3 { #expect(quiet.makeExchange().onLog().outcome == .ok) }
        #expect(quiet.reportedMemory == before)
        #expect(abs(Int(quiet.meter.pointee.used) - before) < LuaState.memoryReportStep)
    }

    @Test func retainDropsTheStatesOfScriptsNoLongerRun() throws {
        let cache = LuaStateCache()
        let old = LuaTest.script("return { on_log = function() end } -- v1")
        let new = LuaTest.script("return { on_log = function() end } -- v2")
        weak let dropped = try cache.state(for: old)
        let kept = try cache.state(for: new)
        #expect(cache.count == 2)
        #expect(try cache.state(for: old) === dropped)
        cache.retain(only: [new.identity])
        #expect(cache.count == 1)
        #expect(dropped == nil)
        #expect(try cache.state(for: new) === kept)
    }

    /// An `on_request` that makes no `ctx` takes the worker's spare exchange, made its own
    /// request's; one that made a `ctx` is not taken back (its request's later hooks share it).
    @Test func anExchangeWithoutCtxIsReusedByTheNextRequest() throws {
        let cache = LuaStateCache()
        let state = try cache.state(for: LuaTest.script("return { on_request = function(req, ctx) ctx.vars.p = req.path end }"))
        let (first, reusable) = cache.requestExchange(on: state, config: .empty, limits: .default, requestID: 1)
        #expect(reusable)
        cache.giveBack(first)
        let (second, _) = cache.requestExchange(on: state, config: .empty, limits: .default, requestID: 2)
        #expect(second === first && second.requestID == 2)
        var view = LuaRequestView(method: "GET", path: "/2")
        #expect(second.onRequest(&view).succeeded && second.hasContext)
        cache.giveBack(second)
        let (third, _) = cache.requestExchange(on: state, config: .empty, limits: .default, requestID: 3)
        #expect(third !== second && !third.hasContext && second.vars()["p"] == .string("/2"))
    }

    @Test func aPolicyTableNamesTheScriptsItRuns() {
        let a = LuaTest.script("return {} -- a")
        let b = LuaTest.script("return {} -- b")
        let table = PolicyTable(entries: [
            PolicyEntry(name: "default", adapters: [LuaAdapter(script: a, origin: "source")]),
            PolicyEntry(
                name: "h.test", adapters: [LuaAdapter(script: b, origin: "source"), LuaAdapter(script: a, origin: "source")]),
        ])
        #expect(table.scripts == [a.identity, b.identity])
        #expect(PolicyTable.empty.scripts.isEmpty)
    }
}

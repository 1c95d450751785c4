import Testing

@testable import SluiceCore

/// A worker's cache of states: one per script content, and after a reload only those of the
/// scripts the new configuration runs (`retain(only:)`, called by each worker as the new
/// configuration takes effect).
@Suite struct LuaStateCacheTests {
    @Test func retainDropsTheStatesOfScriptsNoLongerRun() throws {
        let cache = LuaStateCache()
        let old = LuaTest.script("return { on_log = function() end } -- v1")
        let new = LuaTest.script("return { on_log = function() end } -- v2")
        weak let dropped = try cache.state(for: old)
        let kept = try cache.state(for: new)
        #expect(cache.count == 2)
        #expect(try cache.state(for: old) === dropped)
        cache.retain(only: [new.contentHash])
        #expect(cache.count == 1)
        #expect(dropped == nil)
        #expect(try cache.state(for: new) === kept)
    }

    @Test func aPolicyTableNamesTheScriptsItRuns() {
        let a = LuaTest.script("return {} -- a")
        let b = LuaTest.script("return {} -- b")
        let table = PolicyTable(entries: [
            PolicyEntry(name: "default", adapters: [LuaAdapter(script: a, origin: "source")]),
            PolicyEntry(
                name: "h.test", adapters: [LuaAdapter(script: b, origin: "source"), LuaAdapter(script: a, origin: "source")]),
        ])
        #expect(table.scripts == [a.contentHash, b.contentHash])
        #expect(PolicyTable.empty.scripts.isEmpty)
    }
}

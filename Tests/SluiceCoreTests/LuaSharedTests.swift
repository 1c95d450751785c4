import Testing

@testable import SluiceCore

/// `sluice.shared`'s in-process table: values, TTLs on the injected clock, counters, bounds.
@Suite struct LuaSharedTests {
    @Test func setGetAndExpiry() {
        let table = LuaSharedMemory()
        #expect(table.set("a", .string("x"), ttl: 1_000, now: 0))
        #expect(table.get("a", now: 999) == .string("x"))
        #expect(table.get("a", now: 1_000) == nil)
        #expect(table.set("b", .number(1.5), ttl: nil, now: 0))
        #expect(table.set("b", nil, ttl: nil, now: 0))
        #expect(table.get("b", now: 0) == nil && table.count == 0)
    }

    @Test func incrCountsInAWindowSetWhenTheKeyIsMade() throws {
        let table = LuaSharedMemory()
        #expect(try table.incr("k", by: .integer(1), ttl: 100, now: 0).get() == .integer(1))
        #expect(try table.incr("k", by: .integer(2), ttl: 100, now: 50).get() == .integer(3))
        #expect(try table.incr("k", by: .integer(1), ttl: 100, now: 100).get() == .integer(1))  // a new window
        #expect(try table.incr("k", by: .number(0.5), ttl: nil, now: 150).get() == .number(1.5))
        #expect(table.set("s", .string("x"), ttl: nil, now: 0))
        #expect(throws: LuaSharedMemory.Failure.notANumber) { try table.incr("s", by: .integer(1), ttl: nil, now: 0).get() }
    }

    @Test func aFullTableDropsExpiredKeysThenRefuses() {
        let table = LuaSharedMemory(maxEntries: 2, maxBytes: 1 << 20)
        #expect(table.set("a", .integer(1), ttl: 10, now: 0))
        #expect(table.set("b", .integer(1), ttl: nil, now: 0))
        #expect(table.set("c", .integer(1), ttl: nil, now: 20))  // "a" expired: dropped
        #expect(!table.set("d", .integer(1), ttl: nil, now: 20))
        #expect(throws: LuaSharedMemory.Failure.full) { try table.incr("e", by: .integer(1), ttl: nil, now: 20).get() }
    }

    /// A write the table has no room for leaves the key as it was (the old value is not lost
    /// to the failed write); a key's own bytes count as room for its new value.
    @Test func aWriteThatDoesNotFitKeepsTheOldValue() throws {
        let table = LuaSharedMemory(maxEntries: 10, maxBytes: 100)
        #expect(table.set("k", .string(String(repeating: "a", count: 60)), ttl: nil, now: 0))
        #expect(table.set("other", .string(String(repeating: "b", count: 20)), ttl: nil, now: 0))
        #expect(!table.set("k", .string(String(repeating: "c", count: 90)), ttl: nil, now: 0))
        #expect(table.get("k", now: 0) == .string(String(repeating: "a", count: 60)))
        // In place of its own 61 bytes, 71 fit (71 + 25 <= 100).
        #expect(table.set("k", .string(String(repeating: "d", count: 70)), ttl: nil, now: 0))
        let full = LuaSharedMemory(maxEntries: 2, maxBytes: 1 << 20)
        #expect(full.set("n", .integer(5), ttl: nil, now: 0) && full.set("m", .integer(1), ttl: 50, now: 0))
        #expect(throws: LuaSharedMemory.Failure.full) { try full.incr("x", by: .integer(1), ttl: nil, now: 10).get() }
        #expect(try full.incr("n", by: .integer(1), ttl: nil, now: 10).get() == .integer(6))
        // Once "m" may have expired, the sweep makes room.
        #expect(try full.incr("x", by: .integer(1), ttl: nil, now: 50).get() == .integer(1))
        // A key the sweep drops itself (it expired) is not counted as room twice.
        let tight = LuaSharedMemory(maxEntries: 2, maxBytes: 30)
        #expect(tight.set("a", .string(String(repeating: "a", count: 9)), ttl: 10, now: 0))
        #expect(tight.set("b", .string(String(repeating: "b", count: 9)), ttl: nil, now: 0))
        #expect(!tight.set("a", .string(String(repeating: "c", count: 25)), ttl: nil, now: 20))
        #expect(tight.get("a", now: 20) == nil && tight.get("b", now: 20) == .string(String(repeating: "b", count: 9)))
    }

    @Test func scriptsUseTheProcessTable() throws {
        let key = "lua-shared-test-\(UInt64.random(in: 0...UInt64.max))"
        #expect(try LuaTest.evaluate("sluice.shared.incr('\(key)', 2, 60)") == .integer(2))
        #expect(try LuaTest.evaluate("sluice.shared.incr('\(key)')") == .integer(3))
        #expect(try LuaTest.evaluate("sluice.shared.set('\(key)s', 'v', 60) and sluice.shared.get('\(key)s')") == .string("v"))
        #expect(try LuaTest.evaluate("sluice.shared.get('\(key)-none')") == nil)
        let failed = try LuaTest.evaluate("select(2, sluice.shared.incr('\(key)s'))")
        guard case .string(let message)? = failed else {
            Issue.record("\(String(describing: failed))")
            return
        }
        #expect(message == "sluice.shared: the key holds a string, not a number", "\(message)")
        // Bytes come back as they were, and keys that differ in their bytes are two keys: a
        // raw digest, a NUL, bytes that are not UTF-8, UTF-8 text.
        let bytes = try LuaTest.evaluate(
            """
            (function()
            sluice.shared.set('\(key)\\xff', 'A', 60) sluice.shared.set('\(key)\\xfe', 'B', 60)
            local digest = sluice.sha256('x')
            sluice.shared.set('\(key)d', digest .. '\\0\\1caf\\xe9 é', 60)
            return sluice.shared.get('\(key)\\xff') .. sluice.shared.get('\(key)\\xfe') .. tostring(sluice.shared.get('\(key)d') == digest .. '\\0\\1caf\\xe9 é')
            end)()
            """)
        #expect(bytes == .string("ABtrue"), "\(String(describing: bytes))")
    }
}

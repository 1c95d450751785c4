import Testing

@testable import SluiceCore

/// Hostile scripts the count hook alone cannot stop, and tricks around it: pattern matching
/// runs inside one C call (Sources/CLua/match.h charges its steps to the budget), C and Lua
/// recursion, coroutine tricks. Each ends in a clean error; the e2e suite
/// (Tests/e2e/test_lua_hostile.py) runs the same through the proxy.
@Suite struct LuaHostileTests {
    @Test(arguments: [
        "string.rep('a', 300000):find('.-.-.-.-b')",
        "local s = string.rep(' ', 300000) .. 'x' s:match('^(.-)%s*$y')",
        "string.rep('a', 300000):gsub('a-a-a-b', '')",
        "for w in string.rep('a', 300000):gmatch('a*b') do end",
        "string.rep('a', 1000000):find(string.rep('a', 400000) .. 'b', 1, true)",
        "string.rep('(', 300000):find('%b()')",
        "pcall(string.find, string.rep('a', 300000), '.-.-.-.-b') req.headers:set('x-after', 'pcall')",
    ])
    func patternBombsAreStoppedByTheInstructionBudget(_ body: String) throws {
        let (result, request) = try LuaTest.onRequest("return { on_request = function(req)\n\(body)\nend }")
        #expect(result.outcome.limitKind == .instructions, "\(result.outcome)")
        #expect(result.outcome.message == "test.lua:2: instruction limit reached")
        #expect(result.microseconds < 500_000)
        #expect(request == LuaTest.get())
    }

    @Test func theMeteredPatternFunctionsMatchAsLuasDo() throws {
        let cases: [(String, LuaValue)] = [
            ("select(1, ('hello world'):find('o w'))", .integer(5)),
            ("select(2, ('hello world'):find('o', 6, true))", .integer(8)),
            ("('key=val'):match('(%w+)=(%w+)')", .string("key")),
            ("select(2, ('key=val'):match('(%w+)=(%w+)'))", .string("val")),
            (
                "(function() local t = {} for k, v in ('a=1,b=2'):gmatch('(%w)=(%w)') do t[#t+1] = k .. v end return table.concat(t, ';') end)()",
                .string("a1;b2")
            ),
            ("(('hello'):gsub('l', { l = 'L' }))", .string("heLLo")),
            ("select(2, ('hello'):gsub('l', '%0%0'))", .integer(2)),
            ("(('f(a(b)c)'):match('%b()'))", .string("(a(b)c)")),
            ("(('THE (quick) fox'):find('%f[%a]%a+', 5))", .integer(6)),
            ("string.find('abc', 'b', -10)", .integer(2)),
            (
                "select(2, pcall(string.find, string.rep('x', 40), string.rep('(', 33) .. 'a' .. string.rep(')', 33)))",
                .string("too many captures")
            ),
        ]
        for (expression, expected) in cases {
            #expect(try LuaTest.evaluate(expression) == expected, "\(expression)")
        }
    }

    /// Loops of liblua's table functions and `string.rep` run in C, where the count hook never
    /// fires, over ranges a script picks and without memory: each is charged per element
    /// (Sources/CLua/loops.h) or answered at once, never left to run for hours.
    @Test(arguments: [
        "table.move({}, 1, math.maxinteger, 1)",
        "local t = setmetatable({}, {__len = function() return math.maxinteger - 1 end}) table.insert(t, 1, 'x')",
        "local t = setmetatable({}, {__len = function() return math.maxinteger end}) table.remove(t, 1)",
        "pcall(table.move, {}, 1, math.maxinteger, 1) req.headers:set('x-after', 'pcall')",
    ])
    func cLoopsOverAScriptsRangeAreStoppedByTheInstructionBudget(_ body: String) throws {
        let (result, request) = try LuaTest.onRequest("return { on_request = function(req)\n\(body)\nend }")
        #expect(result.outcome.limitKind == .instructions, "\(result.outcome)")
        #expect(result.microseconds < 500_000)
        #expect(request == LuaTest.get())
    }

    @Test func cLoopsWithoutWorkAndMetamethodsInCAreRefused() throws {
        // Nothing to repeat: empty at once, however many times.
        #expect(try LuaTest.evaluate("#string.rep('', math.maxinteger)") == .integer(0))
        #expect(try LuaTest.evaluate("#string.rep('', math.maxinteger, '')") == .integer(0))
        // C functions as metamethods would make a sort's loops free of the count hook.
        let sort = try LuaTest.outcome(
            "local t = setmetatable({}, {__index = rawlen, __newindex = rawequal, __len = function() return (1 << 31) - 2 end}) "
                + "table.sort(t)")
        #expect(sort.message == "test.lua:2: table.sort: a table with a metatable is not sorted in a script", "\(sort)")
    }

    /// The metered table functions keep Lua 5.4's semantics (LuaPatternTests does the same
    /// for the pattern functions).
    @Test func theMeteredTableFunctionsWorkAsLuasDo() throws {
        let cases: [(String, LuaValue)] = [
            (
                "(function() local t = {1, 2, 3} table.insert(t, 4) table.insert(t, 1, 0) return table.concat(t, ',') end)()",
                .string("0,1,2,3,4")
            ),
            ("(function() local t = {1, 2, 3} table.insert(t, 4, 9) return table.concat(t, ',') end)()", .string("1,2,3,9")),
            ("select(2, pcall(table.insert, {1}, 3, 9))", .string("bad argument #2 to 'table.insert' (position out of bounds)")),
            ("select(2, pcall(table.insert, {1}, 1, 2, 3))", .string("wrong number of arguments to 'insert'")),
            (
                "(function() local t = {1, 2, 3} local r = table.remove(t, 1) return r .. ':' .. table.concat(t, ',') end)()",
                .string("1:2,3")
            ),
            ("(function() local t = {1, 2, 3} local r = table.remove(t) return r .. ':' .. #t end)()", .string("3:2")),
            ("(function() local t = {} return tostring(table.remove(t)) .. #t end)()", .string("nil0")),
            ("(function() local t = {1, 2, 3} return tostring(table.remove(t, 4)) .. #t end)()", .string("nil3")),
            // liblua 5.4.4 names argument #1 here; the position is argument #2.
            ("select(2, pcall(table.remove, {1, 2}, 5))", .string("bad argument #2 to 'table.remove' (position out of bounds)")),
            ("table.concat(table.move({1, 2, 3, 4, 5}, 1, 3, 3), ',')", .string("1,2,1,2,3")),
            ("table.concat(table.move({1, 2, 3, 4, 5}, 3, 5, 1), ',')", .string("3,4,5,4,5")),
            ("table.concat(table.move({1, 2, 3}, 1, 3, 2, {9}), ',')", .string("9,1,2,3")),
            ("#table.move({1, 2}, 2, 1, 1)", .integer(2)),
            ("(function() local t = {3, 1, 2} table.sort(t) return table.concat(t, ',') end)()", .string("1,2,3")),
            (
                "(function() local t = {3, 1, 2} table.sort(t, function(a, b) return a > b end) return table.concat(t, ',') end)()",
                .string("3,2,1")
            ),
            ("string.rep('ab', 3, '-')", .string("ab-ab-ab")),
            ("string.rep('x', 0)", .string("")),
            ("('Hi'):upper() .. ('Hi'):lower() .. ('abc'):reverse() .. ('abc'):sub(2)", .string("HIhicbabc")),
            ("select(2, pcall(string.upper))", .string("bad argument #1 to 'string.upper' (string expected, got no value)")),
            ("utf8.len('héllo')", .integer(5)),
        ]
        for (expression, expected) in cases {
            #expect(try LuaTest.evaluate(expression) == expected, "\(expression)")
        }
    }

    /// Work on a large string inside one C or Swift call, repeated a few VM instructions a
    /// call: charged by the bytes (one period per 16 KiB), so the instruction budget stops
    /// it where the count hook alone would have looked at the clock only every few hundred
    /// calls, long past the wall-clock budget.
    @Test(arguments: [
        "local s = string.rep('a', 2 * 1024 * 1024) for i = 1, 1e9 do sluice.sha256(s) end",
        "local s = string.rep('a', 1024 * 1024) for i = 1, 1e9 do local u = s:upper() end",
        "local s = '--' .. string.rep('a', 1024 * 1024) for i = 1, 1e9 do local ok = load(s) end",
    ])
    func bulkWorkOnLargeStringsIsCharged(_ body: String) throws {
        let (result, _) = try LuaTest.onRequest("return { on_request = function(req)\n\(body)\nend }")
        #expect(result.outcome.limitKind == .instructions, "\(result.outcome)")
        #expect(result.microseconds < 500_000, "\(result.microseconds) µs")
    }

    /// Work inside one library call that no VM instruction counts: each is charged as it goes
    /// (or reads the clock), so the call stops at a budget within its wall-clock limit rather
    /// than seconds later. The default order of `table.sort` on long strings of NULs (Lua
    /// compares them piece by piece), `concat` and `unpack` through a chain of 1,990
    /// `__index` tables, a pattern walking one item per subject byte, a long `[...]` set
    /// tested at every subject byte, a long `gsub`
    /// replacement at every match, `string.packsize` of a long format, `load` of a chunk made
    /// to be slow to compile.
    @Test(arguments: [
        "local s = string.rep('\\0', 3 << 20) local t = {} for i = 1, 200 do t[i] = s end table.sort(t)",
        "local t = setmetatable({}, {__index = rawlen}) for i = 1, 1990 do t = setmetatable({}, {__index = t}) end "
            + "table.concat(t, '', 1, 1e6)",
        "local t = setmetatable({}, {__index = rawlen}) for i = 1, 1990 do t = setmetatable({}, {__index = t}) end "
            + "table.unpack(t, 1, 3e5)",
        "string.find(string.rep('a', (1 << 21) - 1), string.rep('.', 1 << 21))",
        // A long `[...]` set tested at every subject byte: 64 KiB of set for each of 1 MiB.
        "string.find(string.rep('a', 1 << 20), '[' .. string.rep('b', 1 << 16) .. ']')",
        "string.gsub(string.rep('b', 1000), '(a*)', string.rep('%1', 1 << 20))",
        "local f = string.rep('i', 3 << 20) for i = 1, 1e9 do string.packsize(f) end",
        // A chunk slow to compile: each global name is looked up among 150 × 199 locals.
        "local parts, names = {}, {} for i = 1, 199 do names[i] = 'a' .. i end "
            + "for d = 1, 150 do parts[d] = 'local function f' .. d .. '() local ' .. table.concat(names, ',') end "
            + "load(table.concat(parts, ' ') .. ' ' .. string.rep('x=x ', 1e5) .. string.rep(' end', 150))",
    ])
    func uncountedLibraryWorkIsCharged(_ body: String) throws {
        var limits = LuaLimits.default
        limits.wall = .milliseconds(300)
        let (result, _) = try LuaTest.onRequest("return { on_request = function(req)\n\(body)\nend }", limits: limits)
        #expect(result.outcome.limitKind == .instructions || result.outcome.limitKind == .wall, "\(result.outcome)")
        // Seconds each before; the bound leaves room for a loaded machine.
        #expect(result.microseconds < 1_500_000, "\(result.microseconds) µs")
    }

    /// What Swift copies out of a script's values — `ctx.vars`, `json.encode`'s text, header
    /// edits, a `req:respond`'s fields, a log line — is bounded, however often one long string
    /// or one table is named: small in the state's memory is not small as copies.
    @Test func swiftCopiesOfAScriptsValuesAreBounded() throws {
        /// `ctx.vars` as the access log gets them after `on_request` ran `body` (which succeeds),
        /// and how long reading them took.
        func vars(after body: String) throws -> (vars: [String: LuaValue], took: Duration) {
            let state = try LuaTest.load("return { on_request = function(req, ctx) \(body) end }")
            let exchange = state.makeExchange()
            var request = LuaTest.get()
            #expect(exchange.onRequest(&request).outcome == .ok, "\(body)")
            let start = ContinuousClock.now
            let vars = exchange.vars()
            return (vars, ContinuousClock.now - start)
        }
        /// The bytes Swift holds for `v`: its strings and keys, 8 for anything else.
        func size(_ v: LuaValue) -> Int {
            switch v {
            case .string(let s): s.utf8.count
            case .array(let items): items.reduce(0) { $0 + size($1) }
            case .table(let fields): fields.reduce(0) { $0 + $1.key.utf8.count + size($1.value) }
            default: 8
            }
        }

        // One long string as the value of many fields, and as the key of many small tables.
        for body in [
            "local s = string.rep('v', 1 << 20) local t = {} for i = 1, 2000 do t[i] = s end ctx.vars.big = t ctx.vars.small = 'kept'",
            "local k = string.rep('k', 1 << 20) local t = {} for i = 1, 2000 do t[i] = { [k] = 1 } end ctx.vars.keys = t",
        ] {
            let copied = try vars(after: body).vars
            #expect(copied["truncated"] == .bool(true), "\(body)")
            #expect(size(.table(copied)) <= LuaExchange.varsBudget, "\(body)")
        }

        // Keys that are left out (not strings, not a sequence's) are charged as they are walked
        // past: one table of 50,000 of them named 4,000 times is not 200 million steps. One
        // table shared at every level, ten ways and fifteen deep (10^15 paths, a few hundred
        // bytes of Lua): each value is converted once, and only within the budget.
        for body in [
            "local f = {} for i = 1, 50000 do f[i + 0.5] = true end local t = {} for i = 1, 4000 do t[i] = f end "
                + "ctx.vars.floats = t",
            "local t = {'x'} for d = 1, 15 do local n = {} for i = 1, 10 do n[i] = t end t = n end ctx.vars.deep = t",
        ] {
            let (copied, took) = try vars(after: body)
            #expect(copied["truncated"] == .bool(true) && took < .seconds(1), "\(body): \(took)")
        }

        // A sequence's keys are charged once, not by its scan and again: 3,000 numbers (16
        // bytes each) fit in the budget whole.
        let numbers = try vars(after: "local t = {} for i = 1, 3000 do t[i] = i end ctx.vars.n = t").vars
        #expect(numbers["truncated"] == nil)
        if case .array(let items) = numbers["n"] { #expect(items.count == 3000) } else { Issue.record("\(numbers)") }

        for body in [
            "local s = string.rep('v', 1 << 20) local t = {} for i = 1, 5000 do t[i] = s end sluice.json.encode(t)",
            "local s = string.rep('v', 1 << 20) local t = {} for i = 1, 5000 do t[i] = s end req:respond(200, { ['X-Big'] = t })",
            "local s = string.rep('v', 1 << 16) for i = 1, 5000 do req.headers:add('X-Big', s) end",
            // Long keys in a cycle: each level of the encoding keeps its table's keys.
            "local v = string.rep('k', 1 << 20) local t = {} for i = 1, 4 do t[v .. i] = true end t[''] = t "
                + "sluice.json.encode(t)",
        ] {
            let outcome = try LuaTest.outcome(body)
            #expect(outcome.limitKind == .memory, "\(body): \(outcome)")
        }

        nonisolated(unsafe) var lines: [LuaLogLine] = []
        let logs = try LuaState.load(
            LuaTest.script(
                "return { on_request = function(req) local s = string.rep('v', 1 << 20) "
                    + "local t = {} for i = 1, 200 do t[i] = s end sluice.log.info(table.unpack(t)) end }"),
            log: { lines.append($0) })
        var logged = LuaTest.get()
        #expect(logs.makeExchange().onRequest(&logged).outcome == .ok)
        #expect(lines.count == 1 && lines[0].message.utf8.count <= LuaModule.maxLogMessage + 3)

        // A script's error message goes into the access log: its first 8 KiB.
        let error = try LuaTest.outcome("error(string.rep('e', 1 << 20), 0)")
        #expect(error.message.utf8.count <= LuaModule.maxLogMessage + 3 && error.message.hasPrefix("eee"), "\(error)")

        // Header names kept for the state's next calls are short ones: a long name is used once.
        let names = try LuaTest.load(
            "return { on_request = function(req) req.headers:remove(string.rep('A', 1 << 20)) "
                + "req.headers:remove('X-Short') end }")
        var named = LuaTest.get()
        #expect(names.makeExchange().onRequest(&named).outcome == .ok)
        #expect(Array("X-Short".utf8).withUnsafeBytes { names.headerNames.name(for: $0) } != nil)
        #expect([UInt8](repeating: 0x41, count: 1 << 20).withUnsafeBytes { names.headerNames.name(for: $0) } == nil)
    }

    /// A userdata of another kind passed as `req` (a metric counter's payload is 4 bytes, a
    /// message's 8): refused by its size, never read past its end.
    @Test func anotherUserdataAsSelfIsRefused() throws {
        let outcome = try LuaTest.outcome("req.body(sluice.metric('probe_total'))")
        #expect(outcome.message == "test.lua:2: req used outside its call (or on something else)", "\(outcome)")
    }

    @Test func cRecursionIsAnError() throws {
        let outcome = try LuaTest.outcome("local function f(s) return (s:gsub('.', f)) end f('ab')")
        #expect(outcome.message.contains("stack overflow"), "\(outcome)")
    }

    @Test func coroutinesAreNotThere() throws {
        #expect(try LuaTest.outcome("coroutine.wrap(function() end)()").message.contains("global 'coroutine'"))
        // Not even a `yield` reached some other way (a loaded chunk's environment, `_G`).
        #expect(try LuaTest.evaluate("load('return coroutine', 'x', 't', {})() == nil and _G.coroutine == nil") == .bool(true))
    }

    @Test func aStoppedPatternPoisonsTheStateAndTheNextCallRuns() throws {
        let cache = LuaStateCache()
        let script = LuaTest.script(
            "return { on_request = function(req) if req.path == '/bomb' then string.rep('a', 300000):find('.-.-.-b') end end }")
        var bomb = LuaTest.get()
        bomb.path = "/bomb"
        let first = try cache.state(for: script)
        #expect(first.makeExchange().onRequest(&bomb).outcome.limitKind == .instructions)
        var fine = LuaTest.get()
        let next = try cache.state(for: script)
        #expect(next !== first)
        #expect(next.makeExchange().onRequest(&fine).outcome == .ok)
    }
}

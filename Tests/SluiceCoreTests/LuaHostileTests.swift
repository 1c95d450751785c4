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

    @Test func cRecursionIsAnError() throws {
        let outcome = try LuaTest.outcome("local function f(s) return (s:gsub('.', f)) end f('ab')")
        #expect(outcome.message.contains("stack overflow"), "\(outcome)")
    }

    @Test func coroutinesAreNotThere() throws {
        #expect(try LuaTest.outcome("coroutine.wrap(function() end)()").message.contains("global 'coroutine'"))
        #expect(try LuaTest.outcome("pcall(coroutine.yield)").message.contains("global 'coroutine'"))
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

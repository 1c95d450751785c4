import CLua
import Testing

@testable import SluiceCore

/// The load-time refusal of hooks that write globals (`LuaBytecode`): what the compiler makes
/// a global write is refused wherever a hook or its closures do it, with the line; locals named
/// like globals, a local `_ENV` and the top level's own globals are not.
@Suite struct LuaBytecodeTests {
    private func refusal(_ source: String) -> String? {
        do {
            _ = try LuaTest.load(source)
            return nil
        } catch {
            return (error as? LuaLoadError)?.message ?? "\(error)"
        }
    }

    @Test func hookWritesAreRefusedWithTheirLine() {
        #expect(refusal("return { on_request = function(req)\n  x = 1\nend }") == "test.lua:2: hook writes global 'x'")
        #expect(refusal("return { on_log = function(ctx)\n\n  _ENV.y = ctx end }") == "test.lua:3: hook writes global 'y'")
        // A function statement in a hook assigns a global too.
        #expect(refusal("return { on_log = function() function helper() end end }") == "test.lua:1: hook writes global 'helper'")
        // The first in source order, whichever function holds it.
        #expect(
            refusal("local function a() b = 1 end\nlocal function c() d = 1 end\nreturn { on_log = function() a() c() end }")
                == "test.lua:1: hook writes global 'b'")
    }

    @Test func nestedClosuresAreSeenAtAnyDepth() {
        let source = """
            local function outer()
              return function()
                return function()
                  deep = true
                end
              end
            end
            return { on_log = function() outer() end }
            """
        #expect(refusal(source) == "test.lua:4: hook writes global 'deep'")
    }

    @Test func whatIsNotAGlobalWriteLoads() {
        let allowed = [
            // The top level sets globals; hooks read them.
            "limit = 10\nfunction top() return limit end\nreturn { on_log = function(ctx) ctx.vars.v = top() end }",
            // Locals and upvalues named like globals.
            "local x = 1\nreturn { on_log = function() x = 2 local string = 3 string = 4 end }",
            // A local _ENV, and a closure that captures it.
            "return { on_log = function() local _ENV = {} z = 1 return function() w = 2 end end }",
            // Table fields, ctx fields, and reads of globals.
            "return { on_request = function(req, ctx) local t = {} t.x = 1 ctx.vars.y = string.upper('a') end }",
        ]
        for source in allowed { #expect(refusal(source) == nil, "\(source)") }
    }

    @Test func linesAreExactPastTheRelativeLineEncoding() {
        // More than 128 instructions and line jumps over 127 make Lua record absolute lines
        // (the filler adds one constant: past 255, Lua reaches `_ENV` through a register).
        let filler = (1...300).map { _ in "  t[1] = 1" }.joined(separator: "\n")
        let gap = String(repeating: "\n", count: 400)
        let source = "return { on_log = function()\n  local t = {}\n\(filler)\(gap)\n  late = 1\nend }"
        let line = 2 + 300 + 400 + 1
        #expect(refusal(source) == "test.lua:\(line): hook writes global 'late'")
    }

    @Test func everyKindOfConstantIsRead() {
        // Integers, floats, short and long strings, booleans as keys: the reader must not lose
        // its place in the constants, or the names and lines after them would be wrong.
        let L = luaL_newstate()!
        defer { lua_close(L) }
        let source = """
            local t = { [true] = 1.5, [false] = 2, n = 1 << 40, s = 'short', l = '\(String(repeating: "long", count: 20))' }
            return function() t.k = -0.25 g = 1 end
            """
        #expect(luaL_loadstring(L, source) == LUA_OK)
        let chunk = LuaBytecode(LuaBytecode.dump(L))
        #expect(chunk?.hookGlobalWrites == [LuaBytecode.Site(name: "g", line: 2)])
        #expect(LuaBytecode([0x1B, 0x4C, 0x75, 0x61, 0x53]) == nil)
    }
}

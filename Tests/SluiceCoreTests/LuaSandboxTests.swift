import Testing

@testable import SluiceCore

/// Hostile scripts against the sandbox: no way out through `load`, the string metatable,
/// library tables, `rawset`, finalizers, or globals written after load.
@Suite struct LuaSandboxTests {
    @Test func dangerousLibrariesAreAbsent() throws {
        for name in [
            "io", "os", "package", "debug", "coroutine", "require", "dofile", "loadfile", "print", "warn", "collectgarbage",
        ] {
            #expect(try LuaTest.evaluate("\(name) == nil") == .bool(true), "\(name)")
        }
        #expect(try LuaTest.evaluate("string.dump == nil and ('').dump == nil") == .bool(true))
        #expect(try LuaTest.evaluate("type(string.format) == 'function' and math.pi > 3 and utf8.char(72) == 'H'") == .bool(true))
    }

    @Test func loadRefusesBytecode() throws {
        // A binary chunk's signature: refused whatever mode the script asks for.
        #expect(
            try LuaTest.evaluate("select(2, load('\\27Lua\\84\\0', 'x', 'b'))")
                == .string("attempt to load a binary chunk (mode is 't')"))
        #expect(try LuaTest.evaluate("load('return 1 + 1')()") == .integer(2))
    }

    @Test func loadedChunksCannotEscapeTheSandbox() throws {
        // No env: the frozen globals (reads work, writes are refused).
        #expect(try LuaTest.evaluate("load('return io')() == nil and load('return string.rep')() ~= nil") == .bool(true))
        #expect(
            try LuaTest.evaluate("select(2, pcall(load('x = 1')))") == .string("[string \"x = 1\"]:1: script writes global 'x'"))
        // An explicit nil env is the sandbox too, not an environment-less chunk.
        #expect(try LuaTest.evaluate("load('return _G', 'c', 't', nil)() == _G") == .bool(true))
        // A table of the script's own is an environment it may write.
        #expect(
            try LuaTest.evaluate("(function() local env = {} load('y = 2', 'c', 't', env)() return env.y end)()") == .integer(2))
    }

    @Test func theStringMetatableLeadsNowhere() throws {
        #expect(try LuaTest.evaluate("getmetatable('') == false") == .bool(true))
        #expect(try LuaTest.evaluate("pcall(function() return getmetatable('').__index end)") == .bool(false))
        #expect(try LuaTest.evaluate("('abc'):upper()") == .string("ABC"))
    }

    @Test func libraryTablesAndGlobalsAreReadOnly() throws {
        let refused = [
            "string.rep = nil", "rawset(string, 'rep', nil)", "setmetatable(string, nil)", "table.insert = print",
            "sluice.sha256 = nil", "sluice.json.null = 1", "rawset(_G, 'x', 1)", "setmetatable(_G, {})", "_G.x = 1",
            "math.huge = 0",
        ]
        for statement in refused {
            #expect(try LuaTest.evaluate("pcall(function() \(statement) end)") == .bool(false), "\(statement)")
        }
        #expect(try LuaTest.evaluate("getmetatable(_G) == false and getmetatable(string) == false") == .bool(true))
        #expect(
            try LuaTest.evaluate("(function() local n = 0 for k in pairs(string) do n = n + 1 end return n end)()") != .integer(0)
        )
    }

    @Test func globalsAreFrozenAfterTheTopLevel() throws {
        let source = """
            local function helper() return 'h' end
            shared_name = 'set at load'
            return { on_request = function(req)
              req.headers:set('x-a', helper() .. shared_name)
              counter = (counter or 0) + 1
            end }
            """
        // Refused at load (LuaBytecodeTests); through an alias the compiler cannot see, when it runs.
        #expect(throws: LuaLoadError(script: "test.lua", message: "test.lua:5: hook writes global 'counter'")) {
            try LuaTest.load(source)
        }
        let aliased = source.replacing("counter = (counter", with: "_G.counter = (counter")
        let (result, request) = try LuaTest.onRequest(aliased)
        #expect(result.outcome == .error("test.lua:5: script writes global 'counter'"))
        #expect(request == LuaTest.get())
        // Reassigning a global set at load is refused as well.
        let (reassigned, _) = try LuaTest.onRequest("x = 1 return { on_request = function(req) local e = _ENV e.x = 2 end }")
        #expect(reassigned.outcome == .error("test.lua:1: script writes global 'x'"))
    }

    @Test func finalizersAreRefused() throws {
        #expect(
            try LuaTest.evaluate("select(2, pcall(setmetatable, {}, { __gc = function() end }))")
                == .string("__gc metamethods are not allowed"))
    }

    @Test func errorObjectsAreNotAskedForTheirText() throws {
        // A `__tostring` that loops would run outside the budget if the engine called it.
        let outcome = try LuaTest.outcome("error(setmetatable({}, { __tostring = function() while true do end end }))")
        #expect(outcome == .error("test.lua: (error object is a table value)"))
    }

    @Test func loadErrorsAreLocated() {
        #expect(throws: LuaLoadError(script: "test.lua", message: "test.lua:2: unexpected symbol near '='")) {
            try LuaTest.load("return {\n = 1 }")
        }
        #expect(
            throws: LuaLoadError(
                script: "test.lua",
                message:
                    "test.lua: unknown hook 'on_reqest' (the hooks are on_request, on_response, on_log; and every_try = true)"
            )
        ) {
            try LuaTest.load("return { on_reqest = function() end }")
        }
        #expect(throws: LuaLoadError.self) { try LuaTest.load("return 42") }
        #expect(throws: LuaLoadError.self) { try LuaTest.load("return { on_request = 1 }") }
        #expect(throws: LuaLoadError(script: "test.lua", message: "test.lua:1: boom")) { try LuaTest.load("error('boom')") }
    }

    @Test func runtimeErrorsAreLocated() throws {
        let outcome = try LuaTest.outcome("local x = nil\nreturn x.y")
        #expect(outcome == .error("test.lua:3: attempt to index a nil value (local 'x')"))
    }
}

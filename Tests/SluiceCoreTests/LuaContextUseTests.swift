import HTTPTypes
import Testing

@testable import SluiceCore

/// `ctx` is made only for a hook that may touch it (`LuaBytecode.mayUse`): a hook that declares
/// it and never names it gets none (no table made, none kept open for the exchange), and every
/// way of touching it — read, passed on, captured by a closure, returned, written — still sees
/// the exchange's `ctx`.
@Suite struct LuaContextUseTests {
    private func takesContext(_ hooks: String) throws -> (request: Bool?, log: Bool?) {
        let state = try LuaTest.load("return { \(hooks) }")
        return (state.onRequestHook?.takesContext, state.onLogHook?.takesContext)
    }

    @Test func aHookThatNeverNamesCtxGetsNone() throws {
        let unused = [
            #"on_request = function(req, ctx) req.headers:set("X-Seen", req.headers:get("X-Client") or "none") end"#,
            "on_request = function(req, ctx) end",
            "on_request = function(req, ctx) req.path = '/x' req.query = nil local a, b = 1, 2 return a + b end",
            "on_request = function(req, ctx) for i = 1, 3 do req.headers:add('x-i', tostring(i)) end end",
        ]
        for hook in unused { #expect(try takesContext(hook).request == false, "\(hook)") }
        #expect(try takesContext("on_log = function(ctx) end").log == false)
        // The exchange keeps no ctx for it.
        let state = try LuaTest.load("return { \(unused[0]) }")
        let exchange = state.makeExchange()
        var request = LuaTest.get()
        #expect(exchange.onRequest(&request).outcome == .ok)
        #expect(request.headers[HTTPField.Name("X-Seen")!] == "none")
        #expect(!exchange.hasContext)
    }

    @Test func everyWayOfTouchingCtxSeesIt() throws {
        let uses = [
            "req.headers:set('x-t', type(ctx))",
            "local c = ctx req.headers:set('x-t', type(c))",
            "local f = function() return ctx end req.headers:set('x-t', type(f()))",
            "local t = { ctx } req.headers:set('x-t', type(t[1]))",
            "req.headers:set('x-t', ctx and 'table' or 'nil')",
            "if ctx == nil then return end req.headers:set('x-t', 'table')",
            "for k, v in pairs(ctx) do if k == 'vars' then req.headers:set('x-t', type(v) == 'table' and 'table' or '?') end end",
            "req.headers:set('x-t', tostring(ctx):sub(1, 5))",
            "local a, b = select(1, req, ctx) req.headers:set('x-t', type(b))",
            "ctx.vars.seen = true req.headers:set('x-t', type(ctx.vars))",
        ]
        for body in uses {
            let hook = "on_request = function(req, ctx) \(body) end"
            #expect(try takesContext(hook).request == true, "\(body)")
            let (result, request) = try LuaTest.onRequest("return { \(hook) }")
            #expect(result.outcome == .ok, "\(body): \(result.errorMessage ?? "")")
            #expect(request.headers[HTTPField.Name("x-t")!] == "table", "\(body)")
        }
        // Returned, written, or reached through `...`: taken as used.
        for hook in [
            "on_request = function(req, ctx) return req, ctx end", "on_request = function(req, ctx) ctx = nil end",
            "on_request = function(...) end",
        ] {
            #expect(try takesContext(hook).request == true, "\(hook)")
        }
        #expect(try takesContext("on_log = function(ctx) ctx.vars.x = 1 end").log == true)
    }

    @Test func ctxStillCarriesVarsFromOnRequestToOnLog() throws {
        let state = try LuaTest.load(
            "return { on_request = function(req, ctx) ctx.vars.a = 1 end, on_log = function(ctx) ctx.vars.b = ctx.vars.a + 1 end }"
        )
        let exchange = state.makeExchange()
        var request = LuaTest.get()
        #expect(exchange.onRequest(&request).outcome == .ok)
        #expect(exchange.hasContext)
        #expect(exchange.onLog().outcome == .ok)
        #expect(exchange.vars() == ["a": .integer(1), "b": .integer(2)])
    }
}

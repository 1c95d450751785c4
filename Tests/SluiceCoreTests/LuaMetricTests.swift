import Testing

@testable import SluiceCore

/// `sluice.metric(name):inc([n])` (`LuaMetricAPI`): counted into `sluice_lua_metric_total`,
/// names checked at load when literal and at the call otherwise, at most 64 names a script.
/// Each test names its script uniquely: the metrics registry is the process's.
@Suite struct LuaMetricTests {
    private func exposition() -> String {
        String(decoding: SluiceMetrics.shared.exposition(), as: UTF8.self)
    }

    private func load(_ source: String, name: String) throws -> LuaState {
        try LuaState.load(LuaScript(name: name, source: source))
    }

    @Test func countersAreServedByScriptAndName() throws {
        let state = try load(
            "local hits = sluice.metric('hits')\nreturn { on_log = function() hits:inc() sluice.metric('bytes'):inc(40) hits:inc(2) end }",
            name: "metric-served.lua")
        for _ in 0..<2 { #expect(state.makeExchange().onLog().outcome == .ok) }
        let text = exposition()
        #expect(text.contains(#"sluice_lua_metric_total{script="metric-served.lua",name="hits"} 6"#), "\(text)")
        #expect(text.contains(#"sluice_lua_metric_total{script="metric-served.lua",name="bytes"} 80"#))
    }

    @Test func aLiteralBadNameIsALoadError() {
        #expect(
            throws: LuaLoadError(
                script: "metric-literal.lua",
                message: "metric-literal.lua:2: metric name 'Hits-Total' is not [a-z_][a-z0-9_]* of at most 128 characters")
        ) {
            try load("return { on_log = function()\n  sluice.metric('Hits-Total'):inc()\nend }", name: "metric-literal.lua")
        }
        // A name made at run time is the call's to check; `"bad" .. x` is no literal name.
        #expect(throws: Never.self) {
            try load("return { on_log = function(ctx) sluice.metric('Bad-' .. ctx.vars.x) end }", name: "metric-made.lua")
        }
        // At the top level, any bad name fails the load as the call runs.
        #expect(throws: LuaLoadError.self) {
            try load("local m = sluice.metric('9lives') return {}", name: "metric-top.lua")
        }
    }

    @Test func badCallsAreErrors() throws {
        let state = try load(
            "return { on_request = function(req) \(#"sluice.metric(req.path):inc()"#) end }", name: "metric-calls.lua")
        var request = LuaTest.get()
        request.path = "/x"
        #expect(
            state.makeExchange().onRequest(&request).outcome
                == .error("metric-calls.lua:1: metric name '/x' is not [a-z_][a-z0-9_]* of at most 128 characters"))
        // A name is kept for the process's life and written on every scrape: 128 bytes at most.
        #expect(try LuaTest.outcome("sluice.metric(string.rep('a', 128)):inc()").isOK)
        #expect(try LuaTest.outcome("sluice.metric(string.rep('a', 129))").message.contains("of at most 128 characters"))
        for (call, message) in [
            ("sluice.metric('ok'):inc(-1)", "an integer from 0 to 4294967296 expected"),
            ("sluice.metric('ok'):inc(math.maxinteger)", "an integer from 0 to 4294967296 expected"),
            ("sluice.metric('ok'):inc(1.5)", "an integer from 0 to 4294967296 expected"),
            ("sluice.metric('ok').inc({})", "bad argument #1 to 'inc'"),
            ("sluice.metric(42)", "bad argument #1 to 'metric'"),
            ("getmetatable(sluice.metric('ok')).__index = nil", "attempt to index a boolean value"),
        ] {
            #expect(try LuaTest.outcome(call).message.contains(message), "\(call)")
        }
    }

    @Test func aScriptHasAtMost64Names() throws {
        let state = try load(
            "return { on_log = function(ctx) for i = 1, ctx.config.n do sluice.metric('n' .. i):inc() end end }",
            name: "metric-cap.lua")
        #expect(state.makeExchange(config: LuaConfig(["n": .integer(64)])).onLog().outcome == .ok)
        let over = state.makeExchange(config: LuaConfig(["n": .integer(65)])).onLog()
        #expect(over.outcome == .error("metric-cap.lua:1: metric-cap.lua has 64 metric names already; 'n65' is one too many"))
        // The cap is the script's, across states (workers): a new state gets no more.
        let other = try load("return { on_log = function() sluice.metric('n65'):inc() end }", name: "metric-cap.lua")
        #expect(other.makeExchange().onLog().outcome.message.contains("one too many"))
    }
}

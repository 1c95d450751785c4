import HTTPTypes

@testable import SluiceCore

/// Helpers for the Lua engine's tests: states built from literal sources, a GET to edit, and a
/// one-expression evaluator (`on_log` stores the expression in `ctx.vars.v`).
enum LuaTest {
    static func script(_ source: String, name: String = "test.lua") -> LuaScript {
        LuaScript(name: name, source: source)
    }

    static func load(
        _ source: String, limits: LuaLimits = .default, clock: LuaClock = .system, log: @escaping (LuaLogLine) -> Void = { _ in }
    ) throws -> LuaState {
        try LuaState.load(script(source), limits: limits, clock: clock, log: log)
    }

    static func get(_ headers: HTTPFields = [.accept: "*/*", HTTPField.Name("X-Api-Key")!: "k1"]) -> LuaRequestView {
        LuaRequestView(method: "GET", path: "/v1/items", query: "page=2", headers: headers)
    }

    /// Runs `on_request` of `source` on `request`; returns the result and the request after it.
    static func onRequest(
        _ source: String, _ request: LuaRequestView = get(), limits: LuaLimits = .default, config: LuaConfig = .empty
    ) throws -> (LuaCallResult, LuaRequestView) {
        let state = try load(source, limits: limits)
        var request = request
        let result = state.makeExchange(config: config, limits: limits).onRequest(&request)
        return (result, request)
    }

    /// The value of the Lua expression `expression`, evaluated in a hook (so under the frozen
    /// sandbox); nil when it is nil or not representable. Throws the load error.
    static func evaluate(_ expression: String) throws -> LuaValue? {
        let state = try load("return { on_log = function(ctx) ctx.vars.v = (\(expression)) end }")
        let exchange = state.makeExchange()
        let result = exchange.onLog()
        guard result.outcome == .ok else { return .string("ERROR: \(result.errorMessage ?? "")") }
        return exchange.vars()["v"]
    }

    /// The outcome of running `body` as the body of `on_request(req, ctx)`.
    static func outcome(_ body: String, limits: LuaLimits = .default) throws -> LuaCallResult.Outcome {
        // A request whose body was read (`read_body`), so `req:set_body` may replace it.
        var request = get()
        request.body = []
        return try onRequest("return { on_request = function(req, ctx)\n\(body)\nend }", request, limits: limits).0.outcome
    }
}

extension LuaCallResult.Outcome {
    var isOK: Bool { self == .ok }
    var limitKind: LuaLimitKind? {
        if case .limit(let kind, _) = self { return kind }
        return nil
    }
    var message: String {
        switch self {
        case .ok: ""
        case .error(let m), .limit(_, let m): m
        }
    }
}

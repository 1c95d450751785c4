// The Lua engine's cost per request for issue 35's benchmark script (read one request header,
// set another), without sockets: run it under callgrind with two counts and divide the
// difference (start-up cancels out), as Benchmarks/ does for the whole proxy:
//
//     objcopy --strip-debug .build/release/LuaProbe /tmp/lua-probe
//     valgrind --tool=callgrind /tmp/lua-probe 1000 exchanges   # and 3000; (b - a) / 2000
//
// Modes: `memory` (the state's heap), `exchanges` (a LuaExchange and one on_request call per request), `calls` (the call
// alone, one exchange for all), `unique` (the pipeline's case: the request's own headers edited in
// place, a hook without `ctx`), `copy` (the Swift baseline: copy the request, set one header).
import HTTPTypes
import SluiceCore

let script = """
    return { on_request = function(req, ctx)
      req.headers:set('x-tenant', req.headers:get('x-api-key'))
    end }
    """
let state = try LuaState.load(LuaScript(name: "tenant.lua", source: script))
let bare = try LuaState.load(
    LuaScript(name: "bare.lua", source: script.replacing("function(req, ctx)", with: "function(req)")))
let template = LuaRequestView(
    method: "GET", path: "/v1/items", query: "page=2",
    headers: [.accept: "*/*", .userAgent: "wrk", HTTPField.Name("X-Api-Key")!: "k1"])
let config = LuaConfig()
let count = Int(CommandLine.arguments.dropFirst().first ?? "1000") ?? 1000

@MainActor @inline(never)
func exchanges(_ n: Int) -> Int {
    var changed = 0
    for i in 0..<n {
        var request = template
        let exchange = state.makeExchange(config: config, limits: .default, requestID: UInt64(i))
        _ = exchange.onRequest(&request)
        changed &+= request.headers.count
    }
    return changed
}

@MainActor @inline(never)
func callsOnly(_ exchange: LuaExchange, _ n: Int) -> Int {
    var changed = 0
    for _ in 0..<n {
        var request = template
        _ = exchange.onRequest(&request)
        changed &+= request.headers.count
    }
    return changed
}

/// The pipeline's case: the request is its own (its header storage unique), the policy is
/// `fail_closed` (edits in place), the hook takes no `ctx`.
@MainActor @inline(never)
func unique(_ n: Int) -> Int {
    var changed = 0
    var request = template
    request.headers[.via] = "1.1 sluice"  // unique storage from here on
    for i in 0..<n {
        let exchange = bare.makeExchange(config: config, limits: .default, requestID: UInt64(i))
        _ = exchange.onRequest(&request, restoringOnFailure: false)
        changed &+= request.headers.count
    }
    return changed
}

let mode = CommandLine.arguments.dropFirst(2).first ?? "exchanges"
_ = exchanges(1)
switch mode {
case "calls": print(callsOnly(state.makeExchange(config: config), count))
case "unique": print(unique(count))
case "memory":
    print("state heap after load: \(state.memoryInUse) bytes; after \(count) exchanges:", terminator: " ")
    _ = exchanges(count)
    print("\(state.memoryInUse) bytes")
case "copy":
    print(
        (0..<count).reduce(0) { n, _ in
            var r = template
            r.headers[.via] = "x"
            return n &+ r.headers.count
        })
default: print(exchanges(count))
}

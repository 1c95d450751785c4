import HTTPTypes
import SluiceCore
import Testing

@testable import SluiceServer

/// `LuaResponseStage` and the scripts' end of exchange, without sockets: a policy with a
/// `lua` adapter, a head handed to the response chain, and what the stage made of it.
extension StageTests {
    static func policy(_ source: String, onError: LuaAdapter.OnError = .failClosed, retry: Bool = false) -> PolicyEntry {
        var entry = PolicyEntry(
            name: "default",
            adapters: [LuaAdapter(script: LuaScript(name: "t.lua", source: source), origin: "source", onError: onError)])
        if retry { entry.retry = .on(RetryPolicy(limit: 2, budget: nil)) }
        return entry
    }

    /// Runs the first try of a GET through the try stages, then the head stages on `lines`.
    func scriptedResponse(
        _ services: Services, _ lines: [String]
    ) throws -> (Exchange, ResponseVerdict, ResponseHeadContext, InertTransfer) {
        let exchange = try exchange("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", services)
        let model = ProxyRequest(id: exchange.id, method: "GET", url: exchange.target.url, headerFields: [:], body: .none)
        _ = exchange.machine.prepare(model: model)
        _ = exchange.machine.adapted(.success(model))
        var request = UpstreamRequest(
            method: "GET", target: exchange.target, headers: RequestHeaderLines.Builder().makeLines(), body: .none,
            model: model)
        let tried = RequestChain.runTry(&request, exchange, services)
        guard case .send = tried else {
            Issue.record("the try did not go: \(tried)")
            throw ProxyError.malformedRequest("no try")
        }
        let transfer = InertTransfer(exchange.target)
        var context = ResponseHeadContext(response: Self.responseHead(lines), transfer: transfer, canResendBody: true)
        let verdict = ResponseChain.runHead(&context, exchange, services)
        return (exchange, verdict, context, transfer)
    }

    /// Header edits reach the head the transfer forwards (the framing kept); a policy
    /// without scripts hands the transfer nothing.
    @Test func onResponseEditsTheForwardedHead() throws {
        let services = Services([
            Self.policy(
                """
                return { on_response = function(res, ctx)
                  res.headers:set("x-added", "1"); res.headers:remove("server"); ctx.vars.seen = res.status
                end }
                """)
        ])
        let (exchange, verdict, context, transfer) = try scriptedResponse(
            services, ["HTTP/1.1 201 Created", "Server: origin", "Content-Length: 2"])
        guard case .proceed = verdict else {
            Issue.record("the edited head goes on")
            return
        }
        let head = try #require(transfer.replacedHead)
        #expect(head.status == 201)
        #expect(head.value("x-added") == "1")
        #expect(head.value("server") == nil)
        #expect(head.value("content-length") == "2")
        #expect(context.response.value("x-added") == "1", "the later stages see the edited head")
        #expect(exchange.summary.lua?.hook == "on_response")
        #expect(exchange.summary.lua?.vars["seen"] == .integer(201))

        let (_, plain, _, untouched) = try scriptedResponse(Services(), ["HTTP/1.1 200 OK"])
        guard case .proceed = plain else {
            Issue.record("a 200 goes on")
            return
        }
        #expect(untouched.replacedHead == nil)
    }

    /// `res:retry()` is a failed try the retry policy counts; without one the answer goes on.
    @Test func resRetryIsARetryThePolicyCounts() throws {
        let script = "return { on_response = function(res) if res.status == 200 then res:retry() end end }"
        let (exchange, verdict, _, _) = try scriptedResponse(
            Services([Self.policy(script, retry: true)]), ["HTTP/1.1 200 OK", "Content-Length: 0"])
        guard case .discard = verdict else {
            Issue.record("the answer is drained for a retry")
            return
        }
        #expect(exchange.summary.retries.map(\.reason) == ["lua"])

        let (_, passed, _, _) = try scriptedResponse(
            Services([Self.policy(script)]), ["HTTP/1.1 200 OK", "Content-Length: 0"])
        guard case .proceed = passed else {
            Issue.record("without retry the answer goes to the client")
            return
        }
    }

    /// A failed call refuses the response with `fail_closed` (502 with the request id), and
    /// lets it go on unchanged with `fail_open`; so does a change to the framing.
    @Test func aFailedOnResponseRefusesTheResponse() throws {
        let failing = "return { on_response = function(res) res.headers:set('x-a', '1'); error('boom') end }"
        let (exchange, verdict, _, transfer) = try scriptedResponse(
            Services([Self.policy(failing)]), ["HTTP/1.1 200 OK", "Content-Length: 0"])
        guard case .handled = verdict else {
            Issue.record("the stage refused the response")
            return
        }
        #expect(transfer.refused == .luaScriptFailed(script: "t.lua", requestID: exchange.id))
        #expect(exchange.summary.lua?.outcome == "error")
        #expect(exchange.summary.lua?.error?.contains("boom") == true)

        let (_, open, _, untouched) = try scriptedResponse(
            Services([Self.policy(failing, onError: .failOpen)]), ["HTTP/1.1 200 OK", "Content-Length: 0"])
        guard case .proceed = open else {
            Issue.record("fail_open goes on")
            return
        }
        #expect(untouched.replacedHead == nil && untouched.refused == nil)

        let framing = "return { on_response = function(res) res.headers:set('content-length', '9') end }"
        let (_, refused, _, refusing) = try scriptedResponse(
            Services([Self.policy(framing)]), ["HTTP/1.1 200 OK", "Content-Length: 0"])
        guard case .handled = refused else {
            Issue.record("a framing edit fails the call")
            return
        }
        #expect(refusing.refused != nil && refusing.replacedHead == nil)
    }

    /// `on_log` runs at the exchange's end with the `ctx` of the earlier hooks; the access log
    /// shows the merged vars, and every call is counted.
    @Test func onLogSeesTheExchangesContext() throws {
        let script = """
            return {
              on_response = function(res, ctx) ctx.vars.status = res.status end,
              on_log = function(ctx) ctx.vars.logged = ctx.vars.status + 1 end,
            }
            """
        let (exchange, _, _, _) = try scriptedResponse(Services([Self.policy(script)]), ["HTTP/1.1 204 No Content"])
        exchange.end(.ok)
        let lua = try #require(exchange.summary.lua)
        #expect(lua.hook == "on_log")
        #expect(lua.vars == ["status": .integer(204), "logged": .integer(205)])
        #expect(lua.counted.map(\.hook) == ["on_response"])
    }
}

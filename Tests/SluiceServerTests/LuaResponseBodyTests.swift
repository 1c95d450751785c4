import CLibEvent
import HTTPTypes
import SluiceCore
import Testing

@testable import SluiceServer

/// `read_response_body` without sockets: the head asks the transfer to keep the body and runs
/// no script; the body stages (`ResponseChain.runBody`) run the scripts on the kept body (read,
/// replaced, over the limit); the client's answer is framed by the new body's length.
extension StageTests {
    static func bodyPolicy(
        _ source: String, onError: LuaAdapter.OnError = .failClosed, limit: Int = 16, retry: Bool = false,
        alongside other: String? = nil
    ) -> PolicyEntry {
        var limits = LuaLimits.default
        limits.body = limit
        var adapters: [any RequestAdapter] = []
        if let other { adapters.append(LuaAdapter(script: LuaScript(name: "other.lua", source: other), origin: "source")) }
        adapters.append(
            LuaAdapter(
                script: LuaScript(name: "t.lua", source: source), origin: "source", limits: limits, onError: onError,
                readResponseBody: true))
        var entry = PolicyEntry(name: "default", adapters: adapters)
        if retry { entry.retry = .on(RetryPolicy(limit: 2, budget: nil)) }
        return entry
    }

    /// The head's stages, then the body's on `body` (the try's transfer is the head's).
    func keptResponse(
        _ services: Services, _ lines: [String], body: KeptBody.Content
    ) throws -> (Exchange, ResponseVerdict, ResponseHeadContext, InertTransfer) {
        let (exchange, verdict, context, transfer) = try scriptedResponse(services, lines)
        guard case .handled = verdict, transfer.collectLimit != nil else {
            Issue.record("the head asked for its body: \(verdict)")
            throw ProxyError.malformedRequest("no body kept")
        }
        #expect(exchange.summary.lua == nil, "no script ran on the head")
        var bodyContext = ResponseHeadContext(response: context.response, transfer: transfer, canResendBody: true)
        bodyContext.kept = KeptBody(body)
        let answer = ResponseChain.runBody(&bodyContext, exchange, services)
        return (exchange, answer, bodyContext, transfer)
    }

    @Test func aScriptReadsAndReplacesTheKeptBody() throws {
        let script = """
            return { on_response = function(res, ctx)
              ctx.vars.seen = res:body(); res.headers:set("x-len", tostring(#res:body()))
              res:set_body(res:body():upper() .. "!")
            end }
            """
        let other = "return { on_response = function(res, ctx) ctx.vars.other = tostring(res:body()) end }"
        let services = Services([Self.bodyPolicy(script, limit: 100, alongside: other)])
        let (exchange, verdict, context, transfer) = try keptResponse(
            services, ["HTTP/1.1 200 OK", "Transfer-Encoding: chunked"], body: .whole(Array("hello".utf8)))
        #expect(transfer.collectLimit == 100)
        guard case .proceed = verdict, case .whole(let body)? = context.kept?.content else {
            Issue.record("the replaced body goes on: \(verdict)")
            return
        }
        #expect(body == Array("HELLO!".utf8))
        #expect(context.response.value("x-len") == "5")
        #expect(exchange.summary.lua?.vars["seen"] == .string("hello"))
        #expect(exchange.summary.lua?.vars["other"] == .string("nil"), "a script without the key never sees it")
    }

    /// A body over `limits.body` fails the reading script unrun: 502 with `fail_closed`
    /// (mid-body: the transfer refuses; whole: the exchange does), the body as it came with
    /// `fail_open`.
    @Test func aBodyOverTheLimitFailsTheCall() throws {
        let script = "return { on_response = function(res, ctx) ctx.vars.ran = true end }"
        let (exchange, verdict, _, transfer) = try keptResponse(
            Services([Self.bodyPolicy(script)]), ["HTTP/1.1 200 OK"], body: .overLimit)
        guard case .handled = verdict else {
            Issue.record("the response is refused: \(verdict)")
            return
        }
        #expect(transfer.refused == .luaScriptFailed(script: "t.lua", requestID: exchange.id))
        #expect(exchange.summary.lua?.outcome == "limit")
        #expect(exchange.summary.lua?.error?.contains("over limits.body (16)") == true)

        let (_, whole, context, untouched) = try keptResponse(
            Services([Self.bodyPolicy(script)]), ["HTTP/1.1 200 OK"], body: .whole(Array(repeating: 0x61, count: 17)))
        guard case .handled = whole else {
            Issue.record("the whole body is refused: \(whole)")
            return
        }
        #expect(context.kept?.refusal != nil && untouched.refused == nil)

        let (_, open, kept, _) = try keptResponse(
            Services([Self.bodyPolicy(script, onError: .failOpen)]), ["HTTP/1.1 200 OK"],
            body: .whole(Array(repeating: 0x61, count: 17)))
        guard case .proceed = open, case .whole(let body)? = kept.kept?.content else {
            Issue.record("fail_open goes on with the body as it came: \(open)")
            return
        }
        #expect(body.count == 17)
    }

    /// A `206`'s body is a part of a representation, described by its `Content-Range`: a
    /// script may read it, not replace it (the call fails; 502 with `fail_closed`).
    @Test func aPartialBodyIsNotReplaced() throws {
        let script = "return { on_response = function(res) res:set_body('x') end }"
        let (exchange, verdict, context, _) = try keptResponse(
            Services([Self.bodyPolicy(script)]),
            ["HTTP/1.1 206 Partial Content", "Content-Range: bytes 0-4/10", "Content-Length: 5"],
            body: .whole(Array("hello".utf8)))
        guard case .handled = verdict else {
            Issue.record("the call failed: \(verdict)")
            return
        }
        #expect(context.kept?.refusal != nil)
        #expect(exchange.summary.lua?.error?.contains("res:set_body cannot replace a 206's body") == true)
    }

    /// `res:retry()` after reading the body is a failed try the retry policy counts.
    @Test func resRetryAfterTheBody() throws {
        let script = "return { on_response = function(res) if res:body() == 'busy' then res:retry() end end }"
        let (exchange, verdict, _, _) = try keptResponse(
            Services([Self.bodyPolicy(script, retry: true)]), ["HTTP/1.1 200 OK", "Content-Length: 4"],
            body: .whole(Array("busy".utf8)))
        guard case .discard = verdict else {
            Issue.record("a retry: \(verdict)")
            return
        }
        #expect(exchange.summary.retries.map(\.reason) == ["lua"])
    }

    /// A response without a body (here a `204`) is not kept: the scripts run on its head,
    /// and a reading script gets `""` and may not give it one.
    @Test func aBodilessResponseRunsTheScriptsOnItsHead() throws {
        let script =
            "return { on_response = function(res, ctx) ctx.vars.len = #res:body(); res:set_body(ctx.config.b or '') end }"
        let (exchange, verdict, _, transfer) = try scriptedResponse(
            Services([Self.bodyPolicy(script)]), ["HTTP/1.1 204 No Content"])
        guard case .proceed = verdict else {
            Issue.record("the 204 goes on: \(verdict)")
            return
        }
        #expect(transfer.collectLimit == nil)
        #expect(exchange.summary.lua?.vars["len"] == .integer(0))

        let setting = "return { on_response = function(res) res:set_body('x') end }"
        let (_, refused, _, refusing) = try scriptedResponse(
            Services([Self.bodyPolicy(setting)]), ["HTTP/1.1 204 No Content"])
        guard case .handled = refused else {
            Issue.record("a body on a 204 fails the call: \(refused)")
            return
        }
        #expect(refusing.refused != nil)
    }

    /// Without `read_response_body`, `res:set_body` fails the call (the body streams past).
    @Test func setBodyWithoutTheKeyFails() throws {
        let (exchange, verdict, _, transfer) = try scriptedResponse(
            Services([Self.policy("return { on_response = function(res) res:set_body('x') end }")]),
            ["HTTP/1.1 200 OK", "Content-Length: 2"])
        guard case .handled = verdict else {
            Issue.record("the call failed: \(verdict)")
            return
        }
        #expect(transfer.refused != nil && transfer.collectLimit == nil)
        #expect(exchange.summary.lua?.error?.contains("res:set_body needs read_response_body: true") == true)
    }
}

/// The answer made of a kept body (`ResponseEncoder.keptBodyAnswer`): the origin's framing
/// replaced by the body's own length, hop-by-hop fields dropped, `Via` added.
@Suite struct KeptBodyAnswerTests {
    static func answer(
        _ lines: [String], body: String, head: Bool = false, minor: Int = 1, keepAlive: Bool = true
    ) throws -> String {
        var collected = ResponseHeadCollector()
        for line in lines + [""] { _ = Array((line + "\r\n").utf8).withUnsafeBytes { collected.add($0) } }
        let output = evbuffer_new()!
        defer { evbuffer_free(output) }
        try ResponseEncoder.keptBodyAnswer(
            collected, body: Array(body.utf8), isHeadRequest: head, clientMinorVersion: minor, keepAlive: keepAlive,
            viaLine: Array("Via: 1.1 test\r\n".utf8), into: output)
        let n = evbuffer_get_length(output)
        var bytes = [UInt8](repeating: 0, count: n)
        bytes.withUnsafeMutableBytes { _ = evbuffer_remove(output, $0.baseAddress, n) }
        return String(decoding: bytes, as: UTF8.self)
    }

    @Test func aChunkedOriginGetsTheBodysLength() throws {
        let text = try Self.answer(
            [
                "HTTP/1.1 200 OK", "Transfer-Encoding: chunked", "Connection: keep-alive, X-Hop", "X-Hop: 1",
                "Keep-Alive: timeout=5", "Content-Type: application/json",
            ], body: #"{"a":1}"#)
        #expect(
            text
                == "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\nVia: 1.1 test\r\n\r\n"
                + #"{"a":1}"#)
    }

    @Test func theOriginsLengthIsReplaced() throws {
        let text = try Self.answer(["HTTP/1.1 201 Created", "content-length : 100", "X-A: b"], body: "abc")
        #expect(text == "HTTP/1.1 201 Created\r\nX-A: b\r\nContent-Length: 3\r\nVia: 1.1 test\r\n\r\nabc")
    }

    @Test func anHTTP10ClientAndAClosingConnection() throws {
        let text = try Self.answer(["HTTP/1.1 200 OK"], body: "", minor: 0, keepAlive: false)
        #expect(text == "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nVia: 1.1 test\r\nConnection: close\r\n\r\n")
        let head = try Self.answer(["HTTP/1.1 200 OK"], body: "abc", head: true)
        #expect(head == "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nVia: 1.1 test\r\n\r\n", "no body after HEAD")
    }

    @Test func aHeadThatCannotBeForwardedWritesNothing() {
        #expect(throws: ResponseEncoder.InvalidResponse.self) {
            _ = try Self.answer(["HTTP/1.1 200 OK", "Bad Name: x"], body: "abc")
        }
    }

    /// The transfers' store: every byte kept, in order; over the limit says so.
    @Test func theCollectorKeepsUpToItsLimit() {
        let collector = ResponseDisposition.Collector(limit: 4)
        #expect(Array("abc".utf8).withUnsafeBytes { collector.append($0) })
        #expect(!Array("de".utf8).withUnsafeBytes { collector.append($0) })
        #expect(collector.body == Array("abcde".utf8))
    }
}

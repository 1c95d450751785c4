import Foundation
import Testing

@testable import SluiceConfig
@testable import SluiceCore

/// `sluice lua test` (`LuaScriptTest`): messages read from HTTP/1.1 text (CRLF or LF, origin
/// or absolute form), every hook run with one `ctx`, and a failed hook reported.
@Suite struct LuaScriptTestTests {
    @Test func messagesAreReadFromHTTPText() throws {
        let request = try LuaScriptTest.parseRequest(
            "\r\nPOST http://api.test/v1/x?a=1 HTTP/1.1\r\nHost: api.test\r\nX-A:  padded \r\n\r\nbody\r\nmore", file: "r")
        #expect(request.method == "POST" && request.path == "/v1/x" && request.query == "a=1")
        #expect(request.headers[.init("X-A")!] == "padded" && request.headers.count == 2)
        #expect(request.body == Array("body\r\nmore".utf8))
        let response = try LuaScriptTest.parseResponse("HTTP/1.1 404 Not Found\nContent-Type: text/plain\n", file: "s")
        #expect(response.status == 404 && response.headers.count == 1 && response.body == [])
        #expect(throws: LuaScriptTest.Failure.self) { try LuaScriptTest.parseRequest("GET /\n", file: "r") }
        #expect(throws: LuaScriptTest.Failure.self) { try LuaScriptTest.parseRequest("GET / HTTP/1.1\nno colon\n", file: "r") }
        #expect(throws: LuaScriptTest.Failure.self) { try LuaScriptTest.parseResponse("HTTP/1.1 abc\n", file: "s") }
    }

    @Test func everyHookRunsWithOneContext() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent(
            "lua-script-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        func write(_ name: String, _ text: String) throws -> String {
            let path = dir.appendingPathComponent(name).path
            try text.write(toFile: path, atomically: true, encoding: .utf8)
            return path
        }
        let script = try write(
            "t.lua",
            """
            return {
              on_request = function(req, ctx) req.headers:set("X-Key", ctx.config.key) ctx.vars.seen = req.path end,
              on_response = function(res, ctx) res:set_body(ctx.vars.seen) end,
              on_log = function(ctx) ctx.vars.logged = true end,
            }
            """)
        let request = try write("req.http", "GET /p HTTP/1.1\nHost: h\n\n")
        let response = try write("res.http", "HTTP/1.1 200 OK\n\nfrom origin")
        let config = try write("c.yaml", "key: k1\n")
        let report = try LuaScriptTest.run(script: script, request: request, response: response, config: config)
        #expect(!report.failed, "\(report.text)")
        #expect(
            report.text.contains(
                "--- request\nGET /p HTTP/1.1\nHost: h\nX-Key: k1\n\n--- response\nHTTP/1.1 200\nContent-Length: 2\n\n/p\n--- log\n"
            ),
            "\(report.text)")
        #expect(
            report.text.contains(#""hook":"on_log","outcome":"ok""#)
                && report.text.contains(#""vars":{"logged":true,"seen":"/p"}"#))

        // A script that asks for every try cannot wait, here as in the configuration.
        let signer = try write("s.lua", "return { every_try = true, on_request = function(req) end }")
        #expect(throws: LuaScriptTest.Failure.self) {
            try LuaScriptTest.run(script: signer, request: request, response: nil, config: nil, allowHosts: ["a.test"])
        }
        #expect(try !LuaScriptTest.run(script: signer, request: request, response: nil, config: nil).failed)

        let failing = try write("f.lua", "return { on_request = function(req) error('nope') end }")
        let failed = try LuaScriptTest.run(script: failing, request: request, response: nil, config: nil)
        #expect(failed.failed && failed.text.contains("on_request: error: f.lua:1: nope"), "\(failed.text)")
        #expect(throws: LuaScriptTest.Failure.self) {
            try LuaScriptTest.run(script: script, request: request, response: nil, config: try write("bad.yaml", "- a list\n"))
        }
    }
}

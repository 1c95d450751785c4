import HTTPTypes
import Testing

@testable import SluiceCore

/// `LuaRequestView.lines` (`HostPolicy.scriptsOnLines`): a script that reads and edits the
/// forwarded request's lines ends with the same fields as one given them as `HTTPFields`,
/// whichever header methods it uses and in whatever order.
struct LuaHeaderLinesTests {
    /// Lines as a list of name and value pairs (the engine's are `RequestHeaderLines`).
    struct Lines: LuaHeaderLines {
        var fields: [(String, String)]

        func forEachScriptField(_ body: (UnsafeBufferPointer<UInt8>, UnsafeBufferPointer<UInt8>) -> Void) {
            for (name, value) in fields {
                Array(name.utf8).withUnsafeBufferPointer { name in
                    Array(value.utf8).withUnsafeBufferPointer { value in body(name, value) }
                }
            }
        }

        func forEachScriptValue(named name: UnsafeRawBufferPointer, _ body: (UnsafeBufferPointer<UInt8>) -> Void) {
            let key = String(decoding: name, as: UTF8.self).lowercased()
            for (field, value) in fields where field.lowercased() == key {
                Array(value.utf8).withUnsafeBufferPointer { body($0) }
            }
        }
    }

    static let fields: [(String, String)] = [
        ("Accept", "*/*"), ("X-Client", "bench"), ("X-Twice", "a"), ("x-twice", "b"), ("Authorization", "Bearer t"),
    ]

    /// Runs `body` as `on_request` on the fields as lines and as `HTTPFields`: both views after it.
    static func both(_ body: String) throws -> (lines: LuaRequestView, fields: LuaRequestView) {
        let source = "return { on_request = function(req, ctx)\n\(body)\nend }"
        var headers = HTTPFields()
        for (name, value) in fields { headers.append(HTTPField(name: HTTPField.Name(name)!, value: value)) }
        let viaFields = try LuaTest.onRequest(source, LuaRequestView(method: "GET", path: "/p", query: nil, headers: headers))
        let viaLines = try LuaTest.onRequest(
            source, LuaRequestView(method: "GET", path: "/p", query: nil, lines: Lines(fields: fields)))
        #expect(viaFields.0.outcome == .ok)
        #expect(viaLines.0.outcome == .ok)
        return (viaLines.1, viaFields.1)
    }

    @Test func readsAndEditsAsFieldsWould() throws {
        for body in [
            #"req.headers:set("X-Seen", req.headers:get("X-Client") or "none")"#,
            #"req.headers:set("X-Both", req.headers:get("x-twice"))"#,
            #"req.headers:set("X-Twice", "c"); req.headers:set("X-Got", req.headers:get("X-Twice"))"#,
            #"req.headers:add("X-Twice", "c"); req.headers:set("X-Got", req.headers:get("X-TWICE"))"#,
            #"req.headers:remove("Accept"); req.headers:set("X-Got", req.headers:get("accept") or "gone")"#,
            #"req.headers:set("Accept", nil); req.headers:add("Accept", "text/plain")"#,
            #"req.headers:set("X-A", "1"); local n = 0; for k, v in req.headers:each() do n = n + 1 end; req.headers:set("X-N", tostring(n))"#,
            #"req.headers:set("X-All", table.concat(req.headers:get_all("X-Twice"), "|"))"#,
            #"req.headers:set("X-Missing", req.headers:get("X-None") or "nil")"#,
            // Values an edit of lines carries as they are, and those `HTTPField` checks first.
            #"req.headers:set("X-Tab", "a\tb"); req.headers:add("X-Num", 42); req.headers:set("X-Pad", "  p  ")"#,
            #"req.headers:set("X-Utf", "caf\u{e9}"); req.headers:add("X-Ctl", "a\1b"); req.headers:add("X-Sp", " ")"#,
        ] {
            let (lines, fields) = try Self.both(body)
            var materialized = lines
            materialized.materializeHeaders()
            #expect(materialized.headers == fields.headers, "\(body)")
            #expect(materialized.lines == nil && materialized.lineEdits.isEmpty)
        }
    }

    /// A view made on the forwarded URL (`init(method:url:lines:)`) splits it only when the
    /// script reads or sets the path or the query.
    @Test func aViewOnAURLSplitsItWhenReadOrSet() {
        var view = LuaRequestView(method: "GET", url: "http://h:8/a/b?x=1#f", lines: Lines(fields: []))
        #expect(view.keepsURL && view.path == "/a/b" && view.query == "x=1")
        view.query = nil
        #expect(!view.keepsURL && view.path == "/a/b" && view.query == nil)
        let bare = LuaRequestView(method: "GET", url: "http://h", lines: Lines(fields: []))
        #expect(bare.keepsURL && bare.path == "/" && bare.query == nil)
        #expect(bare == LuaRequestView(method: "GET", path: "/", query: nil, lines: Lines(fields: [])))
    }

    @Test func editsStayEditsUntilAFieldIsNeeded() throws {
        let (lines, _) = try Self.both(#"req.headers:set("X-Seen", req.headers:get("X-Client") or "none")"#)
        #expect(lines.lines != nil)
        #expect(lines.headers.isEmpty)
        #expect(lines.lineEdits.count == 1)
        let (each, _) = try Self.both(#"for k, v in req.headers:each() do end"#)
        #expect(each.lines == nil)
        #expect(each.headers[HTTPField.Name("X-Client")!] == "bench")
    }

    @Test func refusedValuesFailTheCallAsOnFields() throws {
        let source = #"return { on_request = function(req) req.headers:set("X-Bad", "a\r\nb") end }"#
        let (result, view) = try LuaTest.onRequest(
            source, LuaRequestView(method: "GET", path: "/p", query: nil, lines: Lines(fields: Self.fields)))
        #expect(result.outcome.message.contains("X-Bad"))
        #expect(view.lineEdits.isEmpty)
    }
}

import HTTPTypes
import SluiceCore
import Testing

@testable import SluiceServer

/// The forwarded request's lines as scripts see and edit them (`HostPolicy.scriptsOnLines`):
/// without the last line (`Via`), and with the scripts' edits made as they are copied.
@Suite struct RequestHeaderLinesScriptTests {
    static func lines(_ fields: [(String, String)]) -> RequestHeaderLines {
        var builder = RequestHeaderLines.Builder()
        for (name, value) in fields { builder.append(name: name.utf8, value: value.utf8) }
        builder.append(line: Array("Via: 1.1 x".utf8))
        return builder.makeLines()
    }

    static let request = lines([("Accept", "*/*"), ("X-Client", "bench"), ("X-Twice", "a"), ("x-twice", "b"), ("X-Last", "z")])

    static func name(_ text: String) -> HTTPField.Name { HTTPField.Name(text)! }

    @Test func scriptsDoNotSeeVia() {
        var seen: [String] = []
        Self.request.forEachScriptField { name, value in
            seen.append(String(decoding: name, as: UTF8.self) + "=" + String(decoding: value, as: UTF8.self))
        }
        #expect(seen == ["Accept=*/*", "X-Client=bench", "X-Twice=a", "x-twice=b", "X-Last=z"])
    }

    @Test func valuesAreFoundByNameInAnyCase() {
        func values(_ name: String) -> [String] {
            var found: [String] = []
            Array(name.utf8).withUnsafeBytes { key in
                Self.request.forEachScriptValue(named: key) { found.append(String(decoding: $0, as: UTF8.self)) }
            }
            return found
        }
        #expect(values("x-twice") == ["a", "b"])
        #expect(values("X-CLIENT") == ["bench"])
        #expect(values("X-Clien").isEmpty && values("Via").isEmpty && values("").isEmpty)
        let empty = Self.lines([("X-Empty", ""), ("X-E", "1")])
        var got: [String] = []
        Array("x-empty".utf8).withUnsafeBytes { key in
            empty.forEachScriptValue(named: key) { got.append(String(decoding: $0, as: UTF8.self)) }
        }
        #expect(got == [""])
    }

    @Test func editsAreMadeAsTheLinesAreCopiedViaLast() {
        var builder = RequestHeaderLines.Builder()
        let edited = Self.request.applying(
            [
                .set(Self.name("X-Seen"), "bench"), .set(Self.name("X-TWICE"), "c"), .add(Self.name("X-Twice"), "d"),
                .remove(Self.name("accept")), .add(Self.name("X-New"), "1"), .remove(Self.name("X-New")),
                .set(Self.name("Content-Length"), "5"),
            ], builder: &builder)
        #expect(edited.lines == ["X-Client: bench", "X-Last: z", "X-Seen: bench", "X-TWICE: c", "X-Twice: d", "Via: 1.1 x"])
        #expect(edited.byteCount == edited.withBytes { bytes, _ in bytes.count })
        let untouched = Self.request.applying([.add(Self.name("X-A"), "1")], builder: &builder)
        #expect(
            untouched.lines == [
                "Accept: */*", "X-Client: bench", "X-Twice: a", "x-twice: b", "X-Last: z", "X-A: 1", "Via: 1.1 x",
            ])
        let last = Self.request.applying([.remove(Self.name("X-Last"))], builder: &builder)
        #expect(last.lines == ["Accept: */*", "X-Client: bench", "X-Twice: a", "x-twice: b", "Via: 1.1 x"])
    }

    /// The builder that made the lines still holds them: an edit that drops none only moves
    /// `Via` after the added fields, with the same lines as a copy would give.
    @Test func editsThatDropNothingReuseTheBuilderThatMadeTheLines() {
        var builder = RequestHeaderLines.Builder()
        builder.append(name: "Host".utf8, value: "a".utf8)
        builder.append(name: "X-Client".utf8, value: "bench".utf8)
        builder.append(line: Array("Via: 1.1 x".utf8))
        let made = builder.makeLines()
        let edited = made.applying([.set(Self.name("X-Seen"), "bench"), .add(Self.name("X-A"), "1")], builder: &builder)
        #expect(edited.lines == ["Host: a", "X-Client: bench", "X-Seen: bench", "X-A: 1", "Via: 1.1 x"])
        #expect(edited.carriesHost && edited.byteCount == edited.withBytes { bytes, _ in bytes.count })
        #expect(made.lines == ["Host: a", "X-Client: bench", "Via: 1.1 x"], "the lines given are not touched")
        var other = RequestHeaderLines.Builder()
        #expect(
            made.applying([.set(Self.name("X-Seen"), "bench"), .add(Self.name("X-A"), "1")], builder: &other).lines
                == edited.lines)
        let dropped = edited.applying([.set(Self.name("x-client"), "c")], builder: &builder)
        #expect(dropped.lines == ["Host: a", "X-Seen: bench", "X-A: 1", "x-client: c", "Via: 1.1 x"])
    }
}

extension RequestHeaderLines {
    /// `applying` with the edits written as `HeaderEdit`s, recorded as a script's would be.
    fileprivate func applying(_ edits: [HeaderEdit], builder: inout Builder) -> RequestHeaderLines {
        applying(LuaLineEdits(edits), builder: &builder)
    }
}

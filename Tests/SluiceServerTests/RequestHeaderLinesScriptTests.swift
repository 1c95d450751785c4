import HTTPTypes
import SluiceCore
import Testing

@testable import SluiceServer

/// The forwarded request's lines as scripts see and edit them (`HostPolicy.scriptsOnLines`):
/// in the worker's builder, before `Via`, and with the scripts' edits made there.
@Suite struct RequestHeaderLinesScriptTests {
    static func builder(_ fields: [(String, String)]) -> RequestHeaderLines.Builder {
        var builder = RequestHeaderLines.Builder()
        for (name, value) in fields { builder.append(name: name.utf8, value: value.utf8) }
        return builder
    }

    static let fields = [("Accept", "*/*"), ("X-Client", "bench"), ("X-Twice", "a"), ("x-twice", "b"), ("X-Last", "z")]
    static let via = Array("Via: 1.1 x".utf8)

    static func name(_ text: String) -> HTTPField.Name { HTTPField.Name(text)! }

    /// The builder's lines with `edits` (written as `HeaderEdit`s, recorded as a script's
    /// would be) made and `Via` last.
    static func finished(_ fields: [(String, String)], _ edits: [HeaderEdit]) -> RequestHeaderLines {
        var builder = builder(fields)
        return builder.finishScripted(LuaLineEdits(edits), viaLine: via)
    }

    @Test func scriptsSeeEveryFieldInOrder() {
        var seen: [String] = []
        Self.builder(Self.fields).forEachScriptField { name, value in
            seen.append(String(decoding: name, as: UTF8.self) + "=" + String(decoding: value, as: UTF8.self))
        }
        #expect(seen == ["Accept=*/*", "X-Client=bench", "X-Twice=a", "x-twice=b", "X-Last=z"])
        var none = 0
        RequestHeaderLines.Builder().forEachScriptField { _, _ in none += 1 }
        #expect(none == 0)
    }

    @Test func valuesAreFoundByNameInAnyCase() {
        func values(_ name: String, in builder: RequestHeaderLines.Builder = Self.builder(Self.fields)) -> [String] {
            var found: [String] = []
            Array(name.utf8).withUnsafeBytes { key in
                builder.forEachScriptValue(named: key) { found.append(String(decoding: $0, as: UTF8.self)) }
            }
            return found
        }
        #expect(values("x-twice") == ["a", "b"])
        #expect(values("X-CLIENT") == ["bench"])
        #expect(values("X-Clien").isEmpty && values("Via").isEmpty && values("").isEmpty)
        #expect(values("x-empty", in: Self.builder([("X-Empty", ""), ("X-E", "1")])) == [""])
        #expect(values("x-a", in: RequestHeaderLines.Builder()).isEmpty)
    }

    @Test func editsAreMadeInTheBuilderViaLast() {
        let edited = Self.finished(
            Self.fields,
            [
                .set(Self.name("X-Seen"), "bench"), .set(Self.name("X-TWICE"), "c"), .add(Self.name("X-Twice"), "d"),
                .remove(Self.name("accept")), .add(Self.name("X-New"), "1"), .remove(Self.name("X-New")),
                .set(Self.name("Content-Length"), "5"),
            ])
        #expect(edited.lines == ["X-Client: bench", "X-Last: z", "X-Seen: bench", "X-TWICE: c", "X-Twice: d", "Via: 1.1 x"])
        #expect(edited.byteCount == edited.withBytes { bytes, _ in bytes.count })
        #expect(
            Self.finished(Self.fields, [.add(Self.name("X-A"), "1")]).lines == [
                "Accept: */*", "X-Client: bench", "X-Twice: a", "x-twice: b", "X-Last: z", "X-A: 1", "Via: 1.1 x",
            ])
        #expect(
            Self.finished(Self.fields, [.remove(Self.name("X-Last"))]).lines == [
                "Accept: */*", "X-Client: bench", "X-Twice: a", "x-twice: b", "Via: 1.1 x",
            ])
        #expect(Self.finished(Self.fields, [.remove(Self.name("accept"))]).lines.first == "X-Client: bench")
        #expect(Self.finished([], []).lines == ["Via: 1.1 x"])
    }

    /// An edit that drops no line only appends to the builder; one that drops lines keeps the
    /// others in order. A copy of the builder taken before (the view's) is not touched.
    @Test func editsKeepHostAndLeaveAnEarlierCopyAlone() {
        var builder = Self.builder([("Host", "a"), ("X-Client", "bench")])
        let copy = builder
        let edited = builder.finishScripted(
            LuaLineEdits([.set(Self.name("X-Seen"), "bench"), .add(Self.name("X-A"), "1")]), viaLine: Self.via)
        #expect(edited.lines == ["Host: a", "X-Client: bench", "X-Seen: bench", "X-A: 1", "Via: 1.1 x"])
        #expect(edited.carriesHost && edited.byteCount == edited.withBytes { bytes, _ in bytes.count })
        var seen: [String] = []
        copy.forEachScriptField { name, _ in seen.append(String(decoding: name, as: UTF8.self)) }
        #expect(seen == ["Host", "X-Client"], "the view's copy is not touched")
        let dropped = Self.finished(
            [("Host", "a"), ("X-Client", "bench"), ("X-Seen", "old")], [.set(Self.name("x-client"), "c")])
        #expect(dropped.lines == ["Host: a", "X-Seen: old", "x-client: c", "Via: 1.1 x"])
        #expect(dropped.carriesHost)
    }

    /// A `Host` an edit drops (one an `upstream:` override put there) is not claimed any more:
    /// the transport derives one from the target.
    @Test func droppingHostLeavesItToTheTransport() {
        let dropped = Self.finished([("Host", "a"), ("X-Client", "bench")], [.remove(Self.name("host"))])
        #expect(dropped.lines == ["X-Client: bench", "Via: 1.1 x"])
        #expect(!dropped.carriesHost)
        let kept = Self.finished([("Host", "a"), ("X-Client", "bench")], [.remove(Self.name("X-Client"))])
        #expect(kept.lines == ["Host: a", "Via: 1.1 x"] && kept.carriesHost)
    }
}

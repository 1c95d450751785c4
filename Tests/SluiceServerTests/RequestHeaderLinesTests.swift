import Testing

@testable import SluiceServer

@Suite struct RequestHeaderLinesTests {
    private func wire(_ lines: RequestHeaderLines) -> String {
        lines.withBytes { bytes, _ in String(decoding: bytes, as: UTF8.self) }
    }

    @Test func linesAreCRLFTerminatedInOneBufferInOrder() {
        var builder = RequestHeaderLines.Builder()
        builder.append(name: Array("X-A".utf8), value: Array("1".utf8))
        builder.append(name: Array("X-Empty".utf8), value: [UInt8]())
        builder.append(line: Array("Via: 1.1 x".utf8))
        let lines = builder.makeLines()
        #expect(lines.count == 3)
        #expect(wire(lines) == "X-A: 1\r\nX-Empty:\r\nVia: 1.1 x\r\n")
        #expect(lines.byteCount == wire(lines).utf8.count)
        #expect(lines.lines == ["X-A: 1", "X-Empty:", "Via: 1.1 x"])
        #expect(!lines.carriesHost)
    }

    @Test func fieldsComeBackAsTheyWentIn() {
        var builder = RequestHeaderLines.Builder()
        builder.append(name: "X-Colon".utf8, value: "a: b:".utf8)
        builder.append(name: "X-Space".utf8, value: " lead".utf8)
        builder.append(name: "X-Empty".utf8, value: "".utf8)
        var fields: [String] = []
        builder.makeLines().forEachField { name, value in
            fields.append(String(decoding: name, as: UTF8.self) + "=" + String(decoding: value, as: UTF8.self))
        }
        #expect(fields == ["X-Colon=a: b:", "X-Space= lead", "X-Empty="])
    }

    @Test func aReusedBuilderStartsAfresh() {
        var builder = RequestHeaderLines.Builder()
        builder.append(name: "Host".utf8, value: "a".utf8)
        let first = builder.makeLines()
        builder.reset()
        builder.append(name: "B".utf8, value: "2".utf8)
        let second = builder.makeLines()
        #expect(
            first.lines == ["Host: a"] && first.carriesHost, "the lines own their bytes: the builder's reuse does not touch them")
        #expect(second.lines == ["B: 2"] && !second.carriesHost)
    }

    /// Lines past the builder's room grow it (written in place, not appended), from every kind
    /// of source; a copy of the builder (a script's view) keeps its lines while the original
    /// goes on, and the other way round.
    @Test func aBuilderGrowsPastItsRoomAndACopyIsItsOwn() {
        var builder = RequestHeaderLines.Builder(capacity: 16, lines: 1)
        let long = String(repeating: "v", count: 300)
        builder.append(name: "X-Long".utf8, value: long.utf8)
        builder.append(name: Array("X-Array".utf8), value: Array(long.utf8)[...])
        builder.append(line: Array("Via: 1.1 x".utf8))
        let copy = builder
        builder.append(name: "X-After".utf8, value: "1".utf8)
        var other = copy
        other.append(lines: builder.makeLines(), 1..<2)
        #expect(builder.makeLines().lines == ["X-Long: " + long, "X-Array: " + long, "Via: 1.1 x", "X-After: 1"])
        #expect(copy.makeLines().lines == ["X-Long: " + long, "X-Array: " + long, "Via: 1.1 x"])
        #expect(other.makeLines().lines == ["X-Long: " + long, "X-Array: " + long, "Via: 1.1 x", "X-Array: " + long])
        #expect(builder.makeLines().byteCount == (8 + 300 + 2) + (9 + 300 + 2) + 12 + 12)
    }

    /// As a script's view and the worker do: the view keeps a copy, the worker's builder is
    /// reset and writes its next request's lines from the start; the copy still reads its own.
    @Test func aCopyKeepsItsLinesWhileTheOriginalIsResetAndRefilled() {
        var builder = RequestHeaderLines.Builder()
        builder.append(name: "X-First".utf8, value: "one".utf8)
        builder.append(line: Array("Via: 1.1 x".utf8))
        let view = builder
        builder.reset()
        builder.append(name: "Y".utf8, value: "two".utf8)
        #expect(view.makeLines().lines == ["X-First: one", "Via: 1.1 x"])
        #expect(builder.makeLines().lines == ["Y: two"])
        var seen: [String] = []
        view.withLines { bytes, _ in seen.append(String(decoding: bytes, as: UTF8.self)) }
        #expect(seen == ["X-First: one\r\nVia: 1.1 x\r\n"], "the copy's bytes end where its lines do")
    }

    /// A script's view holds the builder as `any LuaHeaderLines`: within an existential's
    /// inline three words it needs no box on the heap (an allocation per scripted request).
    @Test func aBuilderFitsAnExistentialsInlineBuffer() {
        #expect(MemoryLayout<RequestHeaderLines.Builder>.size <= 3 * MemoryLayout<Int>.size)
    }

    @Test func anEmptyListHasNoLines() {
        let lines = RequestHeaderLines.Builder().makeLines()
        #expect(lines.count == 0 && lines.byteCount == 0 && lines.lines.isEmpty && wire(lines).isEmpty)
    }

    @Test func appendingMakesNewLinesWithOneMore() {
        var builder = RequestHeaderLines.Builder()
        builder.append(line: Array("Via: 1.1 x".utf8))
        let lines = builder.makeLines()
        let more = lines.appending(name: "host", value: "example.com:8080")
        #expect(lines.lines == ["Via: 1.1 x"] && !lines.carriesHost)
        #expect(more.lines == ["Via: 1.1 x", "host: example.com:8080"])
        #expect(more.carriesHost, "a Host line in any case")
    }

    @Test func replacingDropsNamedFieldsAnyCaseAndAppends() {
        var builder = RequestHeaderLines.Builder()
        builder.append(name: "If-None-Match".utf8, value: "\"client\"".utf8)
        builder.append(name: "Accept".utf8, value: "*/*".utf8)
        builder.append(name: "if-modified-since".utf8, value: "Sun, 06 Nov 1994 08:49:37 GMT".utf8)
        builder.append(name: "If-None-Match-Extra".utf8, value: "kept".utf8)
        builder.append(name: "X-Empty".utf8, value: "".utf8)
        let lines = builder.makeLines()
        let revalidation = lines.replacing(["if-none-match", "if-modified-since"], adding: [("If-None-Match", "\"stored\"")])
        #expect(
            revalidation.lines == ["Accept: */*", "If-None-Match-Extra: kept", "X-Empty:", "If-None-Match: \"stored\""])
        #expect(wire(revalidation) == "Accept: */*\r\nIf-None-Match-Extra: kept\r\nX-Empty:\r\nIf-None-Match: \"stored\"\r\n")
        #expect(lines.count == 5)
    }
}

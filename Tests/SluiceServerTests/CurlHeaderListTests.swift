import Testing

@testable import SluiceServer

/// The conversion libcurl gets: the same lines in the same order, in curl's conventions, with
/// curl's directives at the end.
@Suite struct CurlHeaderListTests {
    @Test func linesKeepTheirOrderInCurlsConventions() {
        var builder = RequestHeaderLines.Builder()
        builder.append(name: "X-A".utf8, value: "1".utf8)
        builder.append(name: "X-Empty".utf8, value: "".utf8)
        builder.append(name: "X-Colon".utf8, value: "a:".utf8)
        builder.append(line: Array("Via: 1.1 x".utf8))
        let list = CurlHeaderList(builder.makeLines())
        #expect(list.lines == ["X-A: 1", "X-Empty;", "X-Colon: a:", "Via: 1.1 x", "Expect:", "Accept:"])
        #expect(list.count == 6)
    }

    @Test func aRequestsAcceptKeepsItsPlace() {
        var builder = RequestHeaderLines.Builder()
        builder.append(name: "accept".utf8, value: "text/html".utf8)
        builder.append(name: "X-B".utf8, value: "2".utf8)
        #expect(CurlHeaderList(builder.makeLines()).lines == ["accept: text/html", "X-B: 2", "Expect:"])
        builder.reset()
        builder.append(name: "Accept".utf8, value: "".utf8)
        #expect(CurlHeaderList(builder.makeLines()).lines == ["Accept;", "Expect:"], "an empty Accept is sent, not curl's")
    }

    @Test func anEmptyListIsOnlyCurlsDirectives() {
        let list = CurlHeaderList(RequestHeaderLines.Builder().makeLines())
        #expect(list.lines == ["Expect:", "Accept:"])
    }

    @Test func theListOwnsItsBytes() {
        var builder = RequestHeaderLines.Builder()
        builder.append(name: "X-A".utf8, value: "1".utf8)
        var lines: RequestHeaderLines? = builder.makeLines()
        let list = CurlHeaderList(lines!)
        lines = nil
        builder.reset()
        builder.append(name: "X-B".utf8, value: "2".utf8)
        _ = builder.makeLines()
        #expect(list.lines == ["X-A: 1", "Expect:", "Accept:"])
    }
}

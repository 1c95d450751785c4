import Testing

@testable import SluiceServer

@Suite struct HeaderListTests {
    @Test func linesAreNulTerminatedAndLinkedInOrder() {
        var builder = HeaderList.Builder()
        builder.append(name: Array("X-A".utf8), value: Array("1".utf8))
        builder.append(name: Array("X-Empty".utf8), value: [UInt8]())
        builder.append(line: "Expect:")
        let list = builder.makeList()
        #expect(list.count == 3)
        #expect(list.lines == ["X-A: 1", "X-Empty;", "Expect:"])
    }

    @Test func aReusedBuilderStartsAfresh() {
        var builder = HeaderList.Builder()
        builder.append(line: "A: 1")
        let first = builder.makeList()
        builder.reset()
        builder.append(line: "B: 2")
        let second = builder.makeList()
        #expect(first.lines == ["A: 1"], "a list owns its bytes: the builder's reuse does not touch it")
        #expect(second.lines == ["B: 2"])
    }

    @Test func anEmptyListIsNoList() {
        let list = HeaderList.Builder().makeList()
        #expect(list.pointer == nil && list.count == 0 && list.lines.isEmpty)
    }

    @Test func appendingMakesANewListWithOneMoreLine() {
        var builder = HeaderList.Builder()
        builder.append(line: "Via: 1.1 x")
        let list = builder.makeList()
        let more = list.appending(name: "Host", value: "example.com:8080")
        #expect(list.lines == ["Via: 1.1 x"])
        #expect(more.lines == ["Via: 1.1 x", "Host: example.com:8080"])
    }

    @Test func replacingDropsNamedFieldsAnyCaseAndAppends() {
        var builder = HeaderList.Builder()
        builder.append(line: "If-None-Match: \"client\"")
        builder.append(line: "Accept: */*")
        builder.append(line: "if-modified-since: Sun, 06 Nov 1994 08:49:37 GMT")
        builder.append(line: "If-None-Match-Extra: kept")
        let list = builder.makeList()
        let revalidation = list.replacing(["if-none-match", "if-modified-since"], adding: [("If-None-Match", "\"stored\"")])
        #expect(revalidation.lines == ["Accept: */*", "If-None-Match-Extra: kept", "If-None-Match: \"stored\""])
        #expect(list.count == 4)
    }
}

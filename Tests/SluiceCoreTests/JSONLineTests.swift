import Foundation
import Testing

@testable import SluiceCore

/// `JSONLine` writes access-log and diagnostic lines byte by byte into a reused buffer: the
/// output must be one valid JSON object per line whatever the values hold.
@Suite struct JSONLineTests {
    private func object(_ line: [UInt8]) throws -> [String: Any] {
        #expect(line.last == 0x0A)
        #expect(line.dropLast().firstIndex(of: 0x0A) == nil)
        return try #require(try JSONSerialization.jsonObject(with: Data(line)) as? [String: Any])
    }

    @Test func escapesWhatJSONNeedsAndPassesUTF8Through() throws {
        var json = JSONLine()
        let nasty = "quote \" backslash \\ newline \n cr \r tab \t nul \u{0} bell \u{7} del \u{7F} é 漢 🙂"
        json.field("v", nasty)
        json.field(named: "key \"named\"", "x")
        let parsed = try object(json.finishBytes())
        #expect(parsed["v"] as? String == nasty)
        #expect(parsed["key \"named\""] as? String == "x")
    }

    @Test func integersAndRawValues() throws {
        var json = JSONLine()
        json.field("zero", 0)
        json.field("max", Int64.max)
        json.field("min", Int64.min + 1)
        json.field("u", UInt64.max)
        json.raw("null", "null")
        json.raw("list", "[1,2]")
        let parsed = try object(json.finishBytes())
        #expect(parsed["zero"] as? Int == 0)
        #expect((parsed["max"] as? NSNumber)?.int64Value == Int64.max)
        #expect((parsed["min"] as? NSNumber)?.int64Value == Int64.min + 1)
        #expect((parsed["u"] as? NSNumber)?.uint64Value == UInt64.max)
        #expect(parsed["null"] is NSNull)
        #expect(parsed["list"] as? [Int] == [1, 2])
    }

    @Test func timingsAreMillisecondsWithThreeDecimals() throws {
        var json = JSONLine()
        var t = TryTimings()
        t.dns = 1_500
        t.tls = 999
        t.firstByte = 12_345_678
        t.total = 12_345_679
        json.timings("t", t)
        let text = String(decoding: json.finishBytes(), as: UTF8.self)
        #expect(text == #"{"t":{"dns":1.500,"connect":0.000,"tls":0.999,"first_byte":12345.678,"total":12345.679}}"# + "\n")
    }

    @Test func aReusedBufferGrowsAndStartsEmpty() throws {
        let buffer = JSONBuffer(capacity: 8)
        var long = JSONLine(reusing: buffer)
        let big = String(repeating: "\u{1}x", count: 5_000)  // 6 bytes out per control byte
        long.field("big", big)
        #expect(try object(Array(long.finishLine()))["big"] as? String == big)
        var short = JSONLine(reusing: buffer)
        short.field("a", "b")
        short.timestamp("time")
        let parsed = try object(Array(short.finishLine()))
        #expect(parsed.count == 2 && parsed["a"] as? String == "b")
        let time = try #require(parsed["time"] as? String)
        #expect(time.count == 24 && time.hasSuffix("Z"))
    }
}

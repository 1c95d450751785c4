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

    /// Values are scanned eight bytes at a time: an escape at any offset of a word, in the
    /// tail, beside multi-byte UTF-8 and in words full of them, comes back as it went in.
    @Test func escapesAtEveryOffsetOfTheWordScan() throws {
        let specials: [Character] = ["\"", "\\", "\n", "\u{0}", "\u{1F}", "\u{7F}", "é", " ", "~"]
        for length in 0...24 {
            for at in 0..<max(length, 1) {
                for special in specials {
                    var chars = Array(repeating: Character("a"), count: length)
                    if length > 0 { chars[at] = special }
                    let value = String(chars) + (length % 3 == 0 ? "\u{7F}\"" : "")
                    var json = JSONLine()
                    json.field("v", value)
                    #expect(try object(json.finishBytes())["v"] as? String == value, "\(length) \(at) \(special)")
                }
            }
        }
        for word in [UInt64(0x6161_6161_6161_6161), 0xC3A9_C3A9_C3A9_C3A9, 0x2020_2020_2020_2020, 0x7E7E_7E7E_7E7E_7E7E] {
            #expect(!JSONLine.needsEscape(word))
        }
        for byte in [UInt64(0x00), 0x1F, 0x22, 0x5C, 0x7F] {
            for shift in stride(from: 0, to: 64, by: 8) {
                let word = (0x6161_6161_6161_6161 & ~(UInt64(0xFF) << shift)) | byte << shift
                #expect(JSONLine.needsEscape(word))
            }
        }
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

    /// Integers of every width, at the edges where they gain a digit, both signs.
    @Test func integersAtEveryWidth() throws {
        var values: [Int64] = [0, 1, 9, 10, 11, 99, 100, 101, Int64.max, Int64.min + 1]
        var power: Int64 = 1
        while power <= Int64.max / 10 {
            power *= 10
            values += [power - 1, power, power + 1, -power, -(power - 1)]
        }
        for v in values {
            var json = JSONLine()
            json.field("v", v)
            #expect(String(decoding: json.finishBytes(), as: UTF8.self) == "{\"v\":\(v)}\n")
        }
        var json = JSONLine()
        json.field("u", UInt64.max)
        #expect(String(decoding: json.finishBytes(), as: UTF8.self) == "{\"u\":\(UInt64.max)}\n")
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

    /// Every width of the whole part, the edges where it gains a digit, and negative values
    /// (the sign with the whole part, none above -1 ms).
    @Test func millisecondsAtEveryWidth() throws {
        var values: [Int64] = [0, 1, 9, 10, 99, 100, 999, 1_000, 1_001, -1, -999, -1_000, -1_500, -12_345_678]
        var power: Int64 = 1
        while power <= Int64.max / 10 {
            power *= 10
            values += [power - 1, power, power + 1, -power]
        }
        values += [Int64.max, Int64.min + 1, Int64.min]
        for us in values {
            var t = TryTimings()
            t.total = us
            var json = JSONLine()
            json.timings("t", t)
            let text = String(decoding: json.finishBytes(), as: UTF8.self)
            let frac = String(String(abs(us % 1000) + 1000).dropFirst())
            let expected = #"{"t":{"dns":0.000,"connect":0.000,"tls":0.000,"first_byte":0.000,"total":"#
            #expect(text == expected + "\(us / 1000).\(frac)}}\n", "\(us)")
        }
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

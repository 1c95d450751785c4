import FuzzSupport
import SluiceCore
import SluiceServer

/// Fuzz target: `HTTPRequestParser`'s head decoding (request line, fields, framing), the
/// input being a stream of (pipelined) requests.
///
/// Checks, beyond "no crash, no hang": the stream parses the same whether it arrives at once
/// or cut into pieces of 1–16 bytes chosen by the input itself; a run without an error
/// consumes every byte; and every head the parser accepts obeys RFC 9112 as the parser
/// promises — a token method, a target of visible ASCII, token field names, values without
/// CR, LF, NUL or other controls, and framing that agrees with the fields.
@main
enum RequestHeadFuzzer {
    /// Small limits, so that the limit checks are reached within `-max_len`.
    static let limits = HTTPRequestParser.Limits(requestLine: 256, headerSection: 2048, headerCount: 24, body: 4096)

    static func main() {
        FuzzDriver.run { data, count in RequestHeadFuzzer.testOneInput(FuzzDriver.bytes(data, count)) }
    }

    /// One input: returns 0, or traps on a finding.
    static func testOneInput(_ input: UnsafeRawBufferPointer) -> Int32 {
        let whole = RequestStream.parse(input, limits: limits)
        var random = SplitMix(seed: UInt64(input.count) &* 31 &+ UInt64(input.first ?? 0))
        let cut = RequestStream.parse(input, limits: limits) { _ in Int(random.next() % 16) + 1 }
        fuzzCheck(whole == cut, "different results whole and cut:\n\(whole)\n\(cut)")
        if whole.error == nil { fuzzCheck(whole.consumed == input.count, "consumed \(whole.consumed) of \(input.count)") }
        for head in whole.heads { check(head) }
        return 0
    }

    static func check(_ head: RequestStream.Head) {
        let b = head.bytes
        fuzzCheck(b.count >= 4 && b.suffix(4) == [13, 10, 13, 10], "head does not end with CRLF CRLF")
        var i = 0
        while isToken(b[i]) { i += 1 }
        fuzzCheck(i > 0 && b[i] == 0x20, "method is not a token")
        i += 1
        let targetStart = i
        while b[i] > 0x20 && b[i] < 0x7F { i += 1 }
        fuzzCheck(i > targetStart && b[i] == 0x20, "target is not visible ASCII")
        let version = Array(b[(i + 1)..<(i + 11)])
        fuzzCheck(version == Array("HTTP/1.1\r\n".utf8) || version == Array("HTTP/1.0\r\n".utf8), "version")
        i += 11
        var contentLengths: Set<Int64?> = []
        var transferEncodings = 0
        var hosts = 0
        while !(b[i] == 13 && b[i + 1] == 10) {
            let nameStart = i
            while isToken(b[i]) { i += 1 }
            fuzzCheck(i > nameStart && b[i] == 0x3A, "field name is not a token")
            let name = String(decoding: b[nameStart..<i], as: UTF8.self).lowercased()
            i += 1
            let valueStart = i
            while b[i] != 13 {
                fuzzCheck(b[i] == 9 || (b[i] >= 0x20 && b[i] != 0x7F), "control byte \(b[i]) in a field value")
                i += 1
            }
            fuzzCheck(b[i + 1] == 10, "bare CR in a field")
            let value = b[valueStart..<i].filter { $0 != 0x20 && $0 != 9 }
            switch name {
            case "content-length":
                for part in value.split(separator: 0x2C) { contentLengths.insert(Int64(String(decoding: part, as: UTF8.self))) }
            case "transfer-encoding": transferEncodings += 1
            case "host": hosts += 1
            default: break
            }
            i += 2
        }
        fuzzCheck(i + 2 == b.count, "bytes after the empty line")
        fuzzCheck(hosts <= 1, "\(hosts) Host fields accepted")
        switch head.framing {
        case .chunked: fuzzCheck(transferEncodings > 0 && contentLengths.isEmpty, "chunked framing without TE alone")
        case .length(let n):
            fuzzCheck(transferEncodings == 0 && contentLengths.count == 1, "length framing with TE or differing lengths")
            fuzzCheck(n >= 0 && n <= limits.body!, "length \(n) beyond the limit")
            fuzzCheck(contentLengths.first! == n, "length differs from the field")
        case .none: fuzzCheck(transferEncodings == 0 && contentLengths.isEmpty, "no framing despite framing fields")
        }
    }

    static func isToken(_ c: UInt8) -> Bool {
        switch c {
        case 0x30...0x39, 0x41...0x5A, 0x61...0x7A: return true
        default: return Array("!#$%&'*+-.^_`|~".utf8).contains(c)
        }
    }
}

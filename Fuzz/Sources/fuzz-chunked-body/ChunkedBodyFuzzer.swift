import FuzzSupport
import SluiceCore

@testable import SluiceServer

/// Fuzz target: `ChunkedDecoder`, the chunked body decoder both HTTP/1.1 parsers share (chunk
/// sizes, extensions, data CRLFs, trailers, the body limit): through `HTTPRequestParser`, and
/// alone with the response parser's rules. The input is what follows a fixed
/// `Transfer-Encoding: chunked` head; its first byte picks the body limit.
///
/// Checks, beyond "no crash, no hang": the same events whether the body arrives at once or in
/// pieces of 1–16 bytes; never more body bytes than the limit; every decoded body equals what
/// a plain reference decoder makes of the same bytes; and where the parser says a body ended,
/// what follows parses exactly as it does for a fresh parser — the decoder consumed the
/// body's bytes and no more (the property request smuggling breaks). The decoder alone, with
/// the response's rules, must meet the same checks: split-independent, and a body it ends is
/// the reference's body, ending where the reference's does.
@main
enum ChunkedBodyFuzzer {
    static let head = Array("POST http://fuzz.test/ HTTP/1.1\r\nHost: fuzz.test\r\nTransfer-Encoding: chunked\r\n\r\n".utf8)
    static let bodyLimits: [Int64?] = [nil, 0, 1, 16, 4096, 1 << 20]

    static func limits(_ body: Int64?) -> HTTPRequestParser.Limits {
        HTTPRequestParser.Limits(requestLine: 1024, headerSection: 2048, headerCount: 24, body: body)
    }

    static func main() {
        FuzzDriver.run { data, count in ChunkedBodyFuzzer.testOneInput(FuzzDriver.bytes(data, count)) }
    }

    /// One input: returns 0, or traps on a finding.
    static func testOneInput(_ raw: UnsafeRawBufferPointer) -> Int32 {
        guard let selector = raw.first else { return 0 }
        let limits = limits(bodyLimits[Int(selector) % bodyLimits.count])
        let input = head + raw.dropFirst()
        input.withUnsafeBytes { input in
            let whole = RequestStream.parse(input, limits: limits)
            var random = SplitMix(seed: UInt64(input.count) &* 131 &+ UInt64(selector))
            let cut = RequestStream.parse(input, limits: limits) { _ in Int(random.next() % 16) + 1 }
            fuzzCheck(whole == cut, "different results whole and cut:\n\(whole)\n\(cut)")
            fuzzCheck(!whole.heads.isEmpty, "the fixed head was refused")
            if let max = limits.body {
                for body in whole.bodies { fuzzCheck(body.count <= max, "body of \(body.count) bytes over \(max)") }
            }
            if whole.ends > 0, let reference = Reference.decode(input[head.count...]) {
                fuzzCheck(whole.bodies.first == reference.body, "body differs from the reference decoder's")
                // The first idle offset is where the first request ended.
                fuzzCheck(
                    whole.idleOffsets.first == head.count + reference.length,
                    "body ended at \(whole.idleOffsets.first ?? -1), the reference at \(head.count + reference.length)")
            }
            if let next = whole.idleOffsets.first, next < input.count {
                let rest = RequestStream.parse(UnsafeRawBufferPointer(rebasing: input[next...]), limits: limits)
                fuzzCheck(
                    rest.heads == Array(whole.heads.dropFirst()) && rest.bodies == Array(whole.bodies.dropFirst())
                        && rest.ends == whole.ends - 1 && rest.error == whole.error,
                    "what follows the body parses differently for a fresh parser")
            }
        }
        let body = Array(raw.dropFirst())
        body.withUnsafeBytes { body in
            let whole = DecoderRun.run(body, rules: responseRules) { _ in body.count }
            var random = SplitMix(seed: UInt64(body.count) &* 7 &+ UInt64(selector))
            let cut = DecoderRun.run(body, rules: responseRules) { _ in Int(random.next() % 16) + 1 }
            fuzzCheck(whole == cut, "the decoder alone differs whole and cut:\n\(whole)\n\(cut)")
            if let end = whole.end {
                let reference = Reference.decode(body)
                fuzzCheck(
                    reference?.body == whole.body && reference?.length == end,
                    "the decoder alone ended a body at \(end) the reference reads as \(String(describing: reference))")
            }
        }
        return 0
    }

    /// `HTTPResponseParser`'s rules for the same limits as `limits(_:)`.
    static let responseRules = ChunkedDecoder.Rules(sizeDigits: 15, body: nil, trailerSection: 2048, trailerFields: 24)
}

/// `ChunkedDecoder` fed in pieces, calling `decode` again while a call returns an event.
enum DecoderRun {
    struct Outcome: Equatable {
        var body: [UInt8] = []
        var end: Int?
        var failure: ChunkedDecoder.Failure?
    }

    /// `piece(offset)`: the length of the piece that starts at `offset`.
    static func run(_ input: UnsafeRawBufferPointer, rules: ChunkedDecoder.Rules, piece: (Int) -> Int) -> Outcome {
        var decoder = ChunkedDecoder(rules: rules)
        var out = Outcome()
        var start = 0
        while start < input.count {
            let stop = min(input.count, start + max(1, piece(start)))
            var at = start
            while true {
                let result: (consumed: Int, event: ChunkedDecoder.Event?)
                do throws(ChunkedDecoder.Failure) {
                    result = try decoder.decode(UnsafeRawBufferPointer(rebasing: input[at..<stop]))
                } catch {
                    out.failure = error
                    return out
                }
                let base = at
                at += result.consumed
                if case .data(let range)? = result.event {
                    fuzzCheck(!range.isEmpty && range.upperBound == result.consumed, "data range \(range) of \(result)")
                    out.body += input[(base + range.lowerBound)..<(base + range.upperBound)]
                    continue
                }
                if result.event == .end {
                    out.end = at
                } else {
                    fuzzCheck(at == stop || decoder.isComplete, "a call without an event left bytes unread")
                    fuzzCheck(!decoder.isComplete || result.consumed == 0, "consumed bytes after the end")
                }
                break
            }
            start = stop
        }
        return out
    }
}

/// RFC 9112 §7.1 chunked decoding, written plainly and separately from the parser: sizes in
/// hex, extensions skipped to the CRLF, data followed by CRLF, trailer lines up to the empty
/// line. Only asked about bodies the parser accepted, so it need not refuse what the parser
/// refuses.
enum Reference {
    static func decode(_ bytes: some Collection<UInt8>) -> (body: [UInt8], length: Int)? {
        let b = Array(bytes)
        var i = 0
        var body: [UInt8] = []
        func line() -> ArraySlice<UInt8>? {
            guard let cr = b[i...].firstIndex(of: 13), cr + 1 < b.count, b[cr + 1] == 10 else { return nil }
            defer { i = cr + 2 }
            return b[i..<cr]
        }
        while true {
            guard let sizeLine = line() else { return nil }
            let hex = sizeLine.prefix { ASCIIHex.value($0) != nil }
            guard !hex.isEmpty, hex.count <= 16 else { return nil }
            let size = hex.reduce(UInt64(0)) { $0 << 4 | ASCIIHex.value($1)! }
            if size == 0 { break }
            guard size <= UInt64(b.count - i), b.count - i - Int(size) >= 2 else { return nil }
            body += b[i..<(i + Int(size))]
            i += Int(size) + 2
        }
        while true {
            guard let trailer = line() else { return nil }
            if trailer.isEmpty { return (body, i) }
        }
    }
}

enum ASCIIHex {
    static func value(_ c: UInt8) -> UInt64? {
        switch c {
        case 0x30...0x39: return UInt64(c - 0x30)
        case 0x41...0x46: return UInt64(c - 0x37)
        case 0x61...0x66: return UInt64(c - 0x57)
        default: return nil
        }
    }
}

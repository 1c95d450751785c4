import Testing

@testable import SluiceServer

/// `ChunkedDecoder` alone, the chunked body decoder both HTTP/1.1 parsers share: valid bodies
/// split at every byte and byte at a time, every refusal, the limits at their boundaries, and
/// the trailer section. (The parsers' own tests check how each words the refusals.)
@Suite struct ChunkedDecoderTests {
    typealias Decoder = ChunkedDecoder

    /// The request parser's rules with a small trailer section.
    static let request = Decoder.Rules(sizeDigits: 16, body: nil, trailerSection: 64, trailerFields: nil)
    /// The response parser's rules with small trailer limits.
    static let response = Decoder.Rules(sizeDigits: 15, body: nil, trailerSection: 64, trailerFields: 3)

    /// What a run produced, compared across splits.
    struct Outcome: Equatable {
        var body: [UInt8] = []
        /// The input offset just after the body's last byte, once `.end` came.
        var end: Int?
        var failure: Decoder.Failure?
    }

    static func b(_ s: String) -> [UInt8] { Array(s.utf8) }

    typealias Step = Result<(consumed: Int, event: Decoder.Event?), Decoder.Failure>

    /// One `decode` call (a helper: typed-throws closures inside `withUnsafeBytes` crash the
    /// 6.3 compiler's SILGen).
    static func decode(_ decoder: inout Decoder, _ piece: ArraySlice<UInt8>) -> Step {
        piece.withUnsafeBytes { buf in
            do throws(Decoder.Failure) {
                return .success(try decoder.decode(buf))
            } catch {
                return .failure(error)
            }
        }
    }

    /// Feeds `input` in pieces cut at `cuts`, calling `decode` again while a call returns an
    /// event; checks that a call without one consumed its whole piece (or nothing, once the
    /// body ended) and that data ranges are non-empty and end where the call's consumption does.
    static func run(_ input: [UInt8], rules: Decoder.Rules, cuts: [Int] = []) -> Outcome {
        var decoder = Decoder(rules: rules)
        var out = Outcome()
        var start = 0
        for stop in cuts + [input.count] where stop > start {
            var at = start
            while true {
                switch decode(&decoder, input[at..<stop]) {
                case .failure(let failure):
                    out.failure = failure
                    return out
                case .success((let n, nil)):
                    #expect(n == stop - at || decoder.isComplete)
                    at += n
                case .success((let n, .data(let range))):
                    #expect(!range.isEmpty && range.upperBound == n)
                    out.body += input[(at + range.lowerBound)..<(at + range.upperBound)]
                    at += n
                    continue
                case .success((let n, .end)):
                    #expect(decoder.isComplete)
                    at += n
                    out.end = at
                }
                break
            }
            start = stop
        }
        #expect(decoder.decodedBytes == Int64(out.body.count))
        return out
    }

    /// One piece, every single cut and byte at a time: all the same, which is returned.
    static func everySplit(
        _ text: String, rules: Decoder.Rules, sourceLocation: SourceLocation = #_sourceLocation
    ) -> Outcome {
        let input = b(text)
        let whole = run(input, rules: rules)
        for cut in 1..<max(1, input.count) {
            #expect(run(input, rules: rules, cuts: [cut]) == whole, "cut at \(cut)", sourceLocation: sourceLocation)
        }
        #expect(
            run(input, rules: rules, cuts: Array(1..<max(1, input.count))) == whole, "byte at a time",
            sourceLocation: sourceLocation)
        return whole
    }

    static func expectFailure(
        _ text: String, _ failure: Decoder.Failure, rules: Decoder.Rules = response,
        sourceLocation: SourceLocation = #_sourceLocation
    ) {
        let o = everySplit(text, rules: rules, sourceLocation: sourceLocation)
        #expect(o.failure == failure, "\(text.debugDescription): \(o)", sourceLocation: sourceLocation)
    }

    // MARK: valid bodies

    @Test func validBodiesAtEverySplit() {
        let bodies: [(String, String)] = [
            ("0\r\n\r\n", ""),
            ("5\r\nhello\r\n0\r\n\r\n", "hello"),
            ("5;name=value\r\nhello\r\nA ; x=\"y z\"\r\n0123456789\r\n1 \r\n!\r\n0;last\r\n\r\n", "hello0123456789!"),
            ("3\t;a;b=c\r\nabc\r\nf\r\n0123456789abcde\r\n00\r\n\r\n", "abc0123456789abcde"),
            ("000000000000003\r\n\r\n\r\r\n0\r\nX-Trailer: t\r\nX-Other:\tu \r\nEmpty:\r\n\r\n", "\r\n\r"),
        ]
        for rules in [Self.request, Self.response] {
            for (text, body) in bodies {
                // What follows the body is never consumed: it belongs to the next message.
                let o = Self.everySplit(text + "GET", rules: rules)
                #expect(o == Outcome(body: Self.b(body), end: text.utf8.count, failure: nil), "\(text.debugDescription)")
            }
        }
    }

    @Test func dataIsReportedNotCopiedAndNothingFollowsTheEnd() throws {
        var decoder = Decoder(rules: Self.response)
        let input = Self.b("3\r\nabc\r\n0\r\n\r\nrest")
        var r = try Self.decode(&decoder, input[...]).get()
        #expect(r.consumed == 6 && r.event == .data(3..<6))
        r = try Self.decode(&decoder, input[6...]).get()
        #expect(r.consumed == 7 && r.event == .end && decoder.isComplete)
        r = try Self.decode(&decoder, input[13...]).get()
        #expect(r.consumed == 0 && r.event == nil)
    }

    @Test func bodilessInputIsIncomplete() {
        let o = Self.everySplit("5\r\nhel", rules: Self.response)
        #expect(o == Outcome(body: Self.b("hel"), end: nil, failure: nil))
        #expect(Self.everySplit("0\r\nX: y\r\n", rules: Self.response) == Outcome())
    }

    // MARK: refusals

    @Test func chunkSizeRefusals() {
        for size in ["", "g", "-1", " 5", "0x5", "+5", "5 6", "5 x", "5\t\tz", ";x", "5\n"] {
            Self.expectFailure(size + "\r\nhello\r\n0\r\n\r\n", .invalidSize)
        }
        Self.expectFailure("5;x\u{1}\r\nhello\r\n", .invalidExtension)
        Self.expectFailure("5 ;x\u{7F}\r\nhello\r\n", .invalidExtension)
        Self.expectFailure("5\rhello\r\n0\r\n\r\n", .bareCRInSizeLine)
        Self.expectFailure("5\r\nhelloXX0\r\n\r\n", .missingCRLFAfterData)
        Self.expectFailure("5\r\nhello\rX0\r\n\r\n", .missingCRLFAfterData)
        Self.expectFailure("5\r\nhello\n0\r\n\r\n", .missingCRLFAfterData)
    }

    @Test func trailerRefusals() {
        Self.expectFailure("0\r\nX: a\r\n b\r\n\r\n", .trailerLineFolding)
        Self.expectFailure("0\r\n\tb\r\n\r\n", .trailerLineFolding)
        Self.expectFailure("0\r\nX : a\r\n\r\n", .trailerWhitespaceBeforeColon)
        Self.expectFailure("0\r\nX\t: a\r\n\r\n", .trailerWhitespaceBeforeColon)
        Self.expectFailure("0\r\nNo colon\r\n\r\n", .trailerWhitespaceBeforeColon)
        Self.expectFailure("0\r\nNoColon\r\n\r\n", .trailerFieldWithoutColon)
        Self.expectFailure("0\r\n: empty\r\n\r\n", .trailerEmptyName)
        Self.expectFailure("0\r\nX(y): a\r\n\r\n", .trailerInvalidNameCharacter)
        Self.expectFailure("0\r\n\u{1}X: a\r\n\r\n", .trailerInvalidNameCharacter)
        Self.expectFailure("0\r\nX: a\u{0}\r\n\r\n", .trailerControlCharacter)
        Self.expectFailure("0\r\nX: a\u{7F}\r\n\r\n", .trailerControlCharacter)
        Self.expectFailure("0\r\nX: a\nY: b\r\n\r\n", .bareLFInTrailer)
        Self.expectFailure("0\r\nX\nY: b\r\n\r\n", .bareLFInTrailer)
        Self.expectFailure("0\r\n\n", .bareLFInTrailer)
        Self.expectFailure("0\r\nX: a\rY: b\r\n\r\n", .bareCRInTrailer)
        Self.expectFailure("0\r\n\rX", .bareCRInTrailer)
        // A request line hidden in the trailer section is a malformed trailer, never a message.
        Self.expectFailure("0\r\nGET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", .trailerWhitespaceBeforeColon)
    }

    // MARK: limits

    @Test func sizeDigitsPerRules() {
        // The response's rules: 15 digits, leading zeros included; the request's: 16.
        Self.expectFailure("1000000000000000\r\n", .sizeTooLarge)
        Self.expectFailure("0000000000000005\r\nhello\r\n0\r\n\r\n", .sizeTooLarge)
        let fifteen = Self.everySplit("FFFFFFFFFFFFFFF\r\nabc", rules: Self.response)
        #expect(fifteen == Outcome(body: Self.b("abc"), end: nil, failure: nil))
        let sixteen = Self.everySplit("FFFFFFFFFFFFFFFF\r\nabc", rules: Self.request)
        #expect(sixteen == Outcome(body: Self.b("abc"), end: nil, failure: nil))
        Self.expectFailure("0000000000000005\r\nhello\r\n0\r\n\r\n", .sizeTooLarge, rules: Self.response)
        #expect(Self.everySplit("0000000000000005\r\nhello\r\n0\r\n\r\n", rules: Self.request).end != nil)
        Self.expectFailure("11111111111111111\r\n", .sizeTooLarge, rules: Self.request)
    }

    @Test func sizeLineLimit() {
        // maxSizeLine bytes without the CRLF are accepted; one more is refused.
        let ext = String(repeating: "e", count: Decoder.maxSizeLine - 2)
        let fits = Self.run(Self.b("5;\(ext)\r\nhello\r\n0\r\n\r\n"), rules: Self.response)
        #expect(fits.body == Self.b("hello") && fits.end != nil)
        let over = Self.run(Self.b("5;\(ext)e\r\nhello\r\n0\r\n\r\n"), rules: Self.response)
        #expect(over.failure == .sizeLineTooLong)
        // Refused at the byte past the limit, before any CR: an endless line holds nothing.
        let endless = Self.run(Self.b("5;" + String(repeating: "e", count: 10_000)), rules: Self.request, cuts: [100, 5000])
        #expect(endless.failure == .sizeLineTooLong)
    }

    @Test func bodyLimit() {
        var rules = Self.request
        rules.body = 16
        // The sizes may add up to the limit exactly.
        #expect(Self.everySplit("8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n", rules: rules).end != nil)
        Self.expectFailure("8\r\n12345678\r\n9\r\n", .bodyTooLarge(limit: 16), rules: rules)
        // Refused at the size line, before any of its data.
        let early = Self.everySplit("11\r\n0123456789abcdef0\r\n0\r\n\r\n", rules: rules)
        #expect(early == Outcome(body: [], end: nil, failure: .bodyTooLarge(limit: 16)))
        // A size near 2^64 after a first chunk is compared with the room left, never summed.
        for size in ["FFFFFFFFFFFFFFFF", "8000000000000000", "7FFFFFFFFFFFFFFE", "e"] {
            Self.expectFailure("3\r\nabc\r\n\(size)\r\n", .bodyTooLarge(limit: 16), rules: rules)
        }
        rules.body = 0
        Self.expectFailure("1\r\n", .bodyTooLarge(limit: 0), rules: rules)
        #expect(Self.everySplit("0\r\n\r\n", rules: rules).end == 5)
    }

    @Test func trailerSectionLimit() {
        // 64 bytes in all, the CRLFs and the final empty line included.
        let line = "T: " + String(repeating: "t", count: 57) + "\r\n"  // 62 bytes, + 2 for the end
        #expect(Self.everySplit("0\r\n" + line + "\r\n", rules: Self.response).end != nil)
        Self.expectFailure("0\r\nT: t" + String(repeating: "t", count: 57) + "\r\n\r\n", .trailerSectionTooLarge(limit: 64))
        Self.expectFailure("0\r\nT: " + String(repeating: "t", count: 1000), .trailerSectionTooLarge(limit: 64))
    }

    @Test func trailerFieldLimit() {
        let three = "0\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n"
        #expect(Self.everySplit(three, rules: Self.response).end == three.utf8.count)
        Self.expectFailure("0\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n", .tooManyTrailerFields(limit: 3))
        // Without a field limit only the section's size bounds them.
        let many = "0\r\n" + String(repeating: "A:\r\n", count: 15) + "\r\n"
        #expect(Self.everySplit(many, rules: Self.request).end == many.utf8.count)
    }

    @Test func reasonsAreTheResponseParsersWording() {
        #expect(Decoder.Failure.bareCRInSizeLine.reason == "bare CR in a chunk-size line")
        #expect(Decoder.Failure.trailerSectionTooLarge(limit: 64).reason == "trailer section larger than 64 bytes")
        #expect(Decoder.Failure.tooManyTrailerFields(limit: 3).reason == "more than 3 trailer fields")
    }
}

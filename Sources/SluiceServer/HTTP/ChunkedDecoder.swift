/// The chunked transfer coding (RFC 9112 §7.1), decoded incrementally: the one decoder behind
/// both HTTP/1.1 parsers, `HTTPRequestParser` (a client's request body) and
/// `HTTPResponseParser` (an origin's response body), as hyper's client and server share
/// `decode.rs`. One decoder, tested and fuzzed once, frames both directions the same way.
///
/// What it accepts, byte by byte, so that any split of the input gives the same result:
/// - a chunk-size line: 1 to `rules.sizeDigits` hex digits, then optionally BWS and
///   extensions (`;` and field-value bytes, not interpreted), or BWS alone, then CRLF; at most
///   `maxSizeLine` bytes without the CRLF. The sizes may not add up past `rules.body`.
/// - chunk data of that size, followed by exactly CRLF;
/// - after the last (zero-size) chunk, the trailer section: field lines (a token name, a
///   colon, a value without control bytes), each ended by CRLF, at most `rules.trailerFields`
///   of them and `rules.trailerSection` bytes in all (CRLFs included), then the empty line.
///   Trailer fields are validated and dropped: neither parser merges them into the head.
/// Bare CR and bare LF are refused everywhere. A refusal is thrown as a `Failure` at the
/// first byte that decides it; it is final (the parsers remember it, the decoder does not).
///
/// Chunk data is never copied: `decode` reports it as a range of the buffer just passed, for
/// the caller to forward or copy. The decoder holds no buffer and allocates nothing.
///
/// Threading: a value inside its parser, owned by that parser's connection, on the worker's
/// thread.
struct ChunkedDecoder: Sendable {
    /// Where the two parsers differ: the request side takes 16 hex digits because it compares
    /// each size with the room left under its body limit (never summing); the response side
    /// has no body limit and takes 15, which keep every size far from overflow.
    struct Rules: Sendable, Equatable {
        /// The most hex digits of a chunk size (leading zeros count).
        var sizeDigits: Int
        /// The most body bytes, the sum of the chunk sizes; nil: no limit.
        var body: Int64?
        /// The largest trailer section, field lines and CRLFs and the final empty line.
        var trailerSection: Int
        /// The most trailer field lines; nil: no limit (the section's size still bounds them).
        var trailerFields: Int?
    }

    /// Why a chunked body was refused. `reason` words it as the response parser reports it;
    /// the request parser words some of them its own way (see its `requestError`).
    enum Failure: Error, Equatable, Sendable {
        /// No hex digit where a size starts, or a byte that fits no chunk-size line.
        case invalidSize
        /// More hex digits than `Rules.sizeDigits`.
        case sizeTooLarge
        /// A chunk-size line over `maxSizeLine` bytes.
        case sizeLineTooLong
        /// A control byte in a chunk extension.
        case invalidExtension
        case bareCRInSizeLine
        /// Chunk data not followed by exactly CRLF.
        case missingCRLFAfterData
        /// A chunk size that would take the body past `Rules.body`.
        case bodyTooLarge(limit: Int64)
        case trailerSectionTooLarge(limit: Int)
        case tooManyTrailerFields(limit: Int)
        case bareCRInTrailer
        case bareLFInTrailer
        /// A trailer line starting with whitespace (obs-fold).
        case trailerLineFolding
        case trailerFieldWithoutColon
        case trailerWhitespaceBeforeColon
        case trailerInvalidNameCharacter
        case trailerEmptyName
        case trailerControlCharacter

        var reason: String {
            switch self {
            case .invalidSize: return "invalid chunk size"
            case .sizeTooLarge: return "chunk size too large"
            case .sizeLineTooLong: return "chunk-size line too long"
            case .invalidExtension: return "invalid chunk extension"
            case .bareCRInSizeLine: return "bare CR in a chunk-size line"
            case .missingCRLFAfterData: return "missing CRLF after chunk data"
            case .bodyTooLarge(let limit): return "chunked body larger than \(limit) bytes"
            case .trailerSectionTooLarge(let limit): return "trailer section larger than \(limit) bytes"
            case .tooManyTrailerFields(let limit): return "more than \(limit) trailer fields"
            case .bareCRInTrailer: return "bare CR in the trailer section"
            case .bareLFInTrailer: return "bare LF in the trailer section"
            case .trailerLineFolding: return "obsolete line folding in a trailer field"
            case .trailerFieldWithoutColon: return "trailer field line without a colon"
            case .trailerWhitespaceBeforeColon: return "whitespace between a trailer field name and the colon"
            case .trailerInvalidNameCharacter: return "invalid character in a trailer field name"
            case .trailerEmptyName: return "empty trailer field name"
            case .trailerControlCharacter: return "NUL or control character in a trailer field value"
            }
        }
    }

    enum Event: Equatable, Sendable {
        /// Chunk data: a non-empty range of the buffer just passed to `decode`.
        case data(Range<Int>)
        /// The trailer section's final LF was consumed: the body is complete.
        case end
    }

    /// The longest chunk-size line (size, BWS and extensions, without the CRLF) accepted.
    static let maxSizeLine = 4096

    private enum State: Sendable {
        /// The chunk-size line: its hex digits, BWS after them, or an extension.
        case sizeDigits, sizeWhitespace, sizeExtension
        /// The size line's CR was read; its LF must follow.
        case sizeLF
        case data
        case dataCR, dataLF
        /// A trailer line: its first byte, its name, its value.
        case trailerStart, trailerName, trailerValue
        /// A trailer field line's CR was read.
        case trailerLF
        /// The empty line's CR was read: its LF ends the body.
        case trailerEndLF
        case done
    }

    let rules: Rules
    private var state = State.sizeDigits
    /// The size being read; then, in `.data`, the chunk's bytes still to come.
    private var size: UInt64 = 0
    private var digits = 0
    /// Bytes of the current chunk-size line so far, without its CRLF.
    private var lineBytes = 0
    private var trailerBytes = 0
    private var trailerFields = 0
    /// Chunk data bytes reported so far.
    private(set) var decodedBytes: Int64 = 0

    init(rules: Rules) {
        self.rules = rules
    }

    /// The body ended (`.end` was returned).
    var isComplete: Bool {
        if case .done = state { return true }
        return false
    }

    /// Consumes bytes of `input` up to the first chunk data (returned as `.data`, consumed up
    /// to its end) or the end of the body (`.end`, consumed up to the trailer section's final
    /// LF), or all of it (no event). Once the body is complete it consumes nothing.
    /// Inlined into each parser: a call per event cost 5–7 % on bodies of small chunks
    /// against the parsers' former built-in states; inlined, it is a little faster than those.
    @inline(__always)
    mutating func decode(_ input: UnsafeRawBufferPointer) throws(Failure) -> (consumed: Int, event: Event?) {
        var i = 0
        while i < input.count {
            switch state {
            case .data:
                let n = Int(min(UInt64(input.count - i), size))
                size -= UInt64(n)
                decodedBytes += Int64(n)
                if size == 0 { state = .dataCR }
                return (i + n, .data(i..<(i + n)))

            case .dataCR:
                guard input[i] == 0x0D else { throw .missingCRLFAfterData }
                i += 1
                state = .dataLF

            case .dataLF:
                guard input[i] == 0x0A else { throw .missingCRLFAfterData }
                i += 1
                state = .sizeDigits
                size = 0
                digits = 0
                lineBytes = 0

            case .sizeDigits, .sizeWhitespace, .sizeExtension:
                let b = input[i]
                i += 1
                if b == 0x0D {
                    guard digits > 0 else { throw .invalidSize }
                    state = .sizeLF
                    continue
                }
                guard lineBytes < Self.maxSizeLine else { throw .sizeLineTooLong }
                lineBytes += 1
                try sizeLineByte(b)

            case .sizeLF:
                guard input[i] == 0x0A else { throw .bareCRInSizeLine }
                i += 1
                if size == 0 {
                    state = .trailerStart
                } else {
                    // Compared with the room left, never summed: a size near 2^64 after a
                    // first chunk would overflow the sum (found by the chunked-body fuzz target).
                    if let max = rules.body, size > UInt64(clamping: max - decodedBytes) {
                        throw .bodyTooLarge(limit: max)
                    }
                    state = .data
                }

            case .trailerStart, .trailerName, .trailerValue, .trailerLF, .trailerEndLF:
                let b = input[i]
                i += 1
                trailerBytes += 1
                if trailerBytes > rules.trailerSection { throw .trailerSectionTooLarge(limit: rules.trailerSection) }
                if try trailerByte(b) { return (i, .end) }

            case .done:
                return (i, nil)
            }
        }
        return (i, nil)
    }

    /// One byte of a chunk-size line other than its CR.
    @inline(__always)
    private mutating func sizeLineByte(_ b: UInt8) throws(Failure) {
        switch state {
        case .sizeDigits:
            if let h = ASCII.hexValue(b) {
                guard digits < rules.sizeDigits else { throw .sizeTooLarge }
                size = size << 4 | h
                digits += 1
            } else if digits > 0 && (b == 0x20 || b == 0x09) {
                state = .sizeWhitespace
            } else if digits > 0 && b == 0x3B {
                state = .sizeExtension
            } else {
                throw .invalidSize
            }
        case .sizeWhitespace:
            // BWS may only lead to an extension (or the line's end).
            if b == 0x3B {
                state = .sizeExtension
            } else if b != 0x20 && b != 0x09 {
                throw .invalidSize
            }
        default:
            // The extension's contents are not interpreted; only its bytes are checked.
            guard ASCII.isFieldValueByte(b) else { throw .invalidExtension }
        }
    }

    /// One byte of the trailer section (already counted); true when it ended the body.
    private mutating func trailerByte(_ b: UInt8) throws(Failure) -> Bool {
        switch state {
        case .trailerLF, .trailerEndLF:
            guard b == 0x0A else { throw .bareCRInTrailer }
            if case .trailerEndLF = state {
                state = .done
                return true
            }
            trailerFields += 1
            if let max = rules.trailerFields, trailerFields > max { throw .tooManyTrailerFields(limit: max) }
            state = .trailerStart
            return false
        case .trailerStart:
            if b == 0x0D {
                state = .trailerEndLF
            } else if ASCII.isTokenChar(b) {
                state = .trailerName
            } else {
                throw Self.nameFailure(b, first: true)
            }
        case .trailerName:
            if b == 0x3A {
                state = .trailerValue
            } else if !ASCII.isTokenChar(b) {
                throw b == 0x0D ? .trailerFieldWithoutColon : Self.nameFailure(b, first: false)
            }
        default:
            if b == 0x0D {
                state = .trailerLF
            } else if b == 0x0A {
                throw .bareLFInTrailer
            } else if !ASCII.isFieldValueByte(b) {
                throw .trailerControlCharacter
            }
        }
        return false
    }

    /// The failure for a byte that cannot continue a trailer field name (not CR).
    private static func nameFailure(_ b: UInt8, first: Bool) -> Failure {
        switch b {
        case 0x0A: return .bareLFInTrailer
        case 0x20, 0x09: return first ? .trailerLineFolding : .trailerWhitespaceBeforeColon
        case 0x3A: return .trailerEmptyName  // only reached for the first byte
        default: return .trailerInvalidNameCharacter
        }
    }
}

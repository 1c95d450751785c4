/// The contents of a JSON string literal (RFC 8259 §7) decoded to UTF-8 bytes: the one decoder
/// behind `sluice.json.decode` (`LuaJSON`) and `JSONObjectFields` (an OAuth token response).
///
/// Escapes: `\" \\ \/ \b \f \n \r \t` and `\uXXXX`, a surrogate pair joined into one scalar; a
/// lone surrogate becomes U+FFFD (as most decoders do). A raw control character (below 0x20)
/// is refused, as the grammar says. The bytes between escapes are copied as they are: whether
/// they are valid UTF-8 is the caller's question.
///
/// Threading: a stateless function over the caller's bytes.
enum JSONStringLiteral {
    /// Why a literal is refused; `description` is what `sluice.json.decode` says.
    enum Problem: String, Error {
        case unterminated = "unterminated string"
        case unexpectedEnd = "unexpected end"
        case badEscape = "bad escape"
        case badUnicodeEscape = "bad \\u escape"
        case badSurrogatePair = "bad surrogate pair"
        case controlCharacter = "control character in a string"
    }

    /// Decodes the literal whose opening quote is right before `position` in `text`; on success
    /// `position` is past its closing quote. On failure `position` is where decoding stopped.
    static func decode<Bytes: RandomAccessCollection<UInt8>>(
        _ text: Bytes, from position: inout Int
    ) -> Result<[UInt8], Problem> where Bytes.Index == Int {
        var out: [UInt8] = []
        while position < text.endIndex {
            let b = text[position]
            position += 1
            switch b {
            case UInt8(ascii: "\""): return .success(out)
            case UInt8(ascii: "\\"):
                guard position < text.endIndex else { return .failure(.unexpectedEnd) }
                let e = text[position]
                position += 1
                switch e {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(e)
                case UInt8(ascii: "b"): out.append(0x08)
                case UInt8(ascii: "f"): out.append(0x0C)
                case UInt8(ascii: "n"): out.append(0x0A)
                case UInt8(ascii: "r"): out.append(0x0D)
                case UInt8(ascii: "t"): out.append(0x09)
                case UInt8(ascii: "u"):
                    guard var scalar = hex4(text, &position) else { return .failure(.badUnicodeEscape) }
                    if (0xD800..<0xDC00).contains(scalar), position + 1 < text.endIndex, text[position] == UInt8(ascii: "\\"),
                        text[position + 1] == UInt8(ascii: "u")
                    {
                        position += 2
                        guard let low = hex4(text, &position), (0xDC00..<0xE000).contains(low) else {
                            return .failure(.badSurrogatePair)
                        }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    }
                    out += Array(String(Unicode.Scalar(scalar).map(Character.init) ?? "\u{FFFD}").utf8)
                default: return .failure(.badEscape)
                }
            case 0..<0x20: return .failure(.controlCharacter)
            default: out.append(b)
            }
        }
        return .failure(.unterminated)
    }

    /// Four hex digits at `position` (moved past them), or nil.
    private static func hex4<Bytes: RandomAccessCollection<UInt8>>(_ text: Bytes, _ position: inout Int) -> UInt32?
    where Bytes.Index == Int {
        guard position + 4 <= text.endIndex else { return nil }
        var v: UInt32 = 0
        for _ in 0..<4 {
            let c = text[position]
            position += 1
            let d: UInt32
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): d = UInt32(c - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): d = UInt32(c - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): d = UInt32(c - UInt8(ascii: "A") + 10)
            default: return nil
            }
            v = v << 4 | d
        }
        return v
    }
}

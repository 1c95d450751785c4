import SluiceCore

/// A parsed HTTP/1.x request head, kept as its raw bytes plus ranges into them.
///
/// Field names and values are not turned into `String`s unless asked for: forwarding copies
/// them byte for byte (obs-text included), and the framing facts a proxy needs — body framing,
/// `Connection` tokens, `Expect` — are computed once by the parser.
public struct HTTPRequestHead: Sendable {
    public struct Field: Sendable {
        public var name: Range<Int>
        public var value: Range<Int>
    }

    public enum BodyFraming: Sendable, Equatable {
        case none
        case length(Int64)
        case chunked
    }

    /// The head's bytes, from the method to the last field's CRLF.
    public let bytes: [UInt8]
    public let methodRange: Range<Int>
    public let targetRange: Range<Int>
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    public let minorVersion: Int
    public let fields: [Field]
    public let framing: BodyFraming
    /// Lower-cased tokens of every `Connection` field.
    public let connectionTokens: [String]
    /// The client sent `Expect: 100-continue`.
    public let expectsContinue: Bool

    /// Whether a body follows the head (and the parser will end it with `.end`).
    public var hasBody: Bool { framing != .none && framing != .length(0) }

    /// The method; the common ones as literals, which cost no decoding nor allocation (the
    /// method is read by admission, the try and the scripts: some 140 instructions each).
    public var method: String {
        switch methodRange.count {
        case 3 where methodIs("GET"): "GET"
        case 4 where methodIs("POST"): "POST"
        case 4 where methodIs("HEAD"): "HEAD"
        case 3 where methodIs("PUT"): "PUT"
        default: string(methodRange)
        }
    }
    public var target: String { string(targetRange) }

    /// Whether the client wants the connection kept open after this exchange
    /// (RFC 9112 §9.3: HTTP/1.1 unless `close`; HTTP/1.0 only with `keep-alive`).
    public var keepAlive: Bool {
        if connectionTokens.contains("close") { return false }
        return minorVersion == 1 || connectionTokens.contains("keep-alive")
    }

    /// The `Upgrade` field values, when `Connection` lists `upgrade` (RFC 9110 §7.8); empty
    /// otherwise.
    public var upgradeValues: [String] {
        guard connectionTokens.contains("upgrade") else { return [] }
        return values(named: "upgrade")
    }

    public func string(_ range: Range<Int>) -> String {
        String(decoding: bytes[range], as: UTF8.self)
    }

    public func name(_ field: Field) -> String { string(field.name) }
    public func value(_ field: Field) -> String { string(field.value) }

    /// Whether `field`'s name equals `lowercaseName` ignoring ASCII case.
    public func field(_ field: Field, isNamed lowercaseName: String) -> Bool {
        bytes.withUnsafeBufferPointer { buf in
            ASCII.equalsIgnoringCase(UnsafeBufferPointer(rebasing: buf[field.name]), string: lowercaseName)
        }
    }

    /// The values of every field named `lowercaseName`, in order.
    public func values(named lowercaseName: String) -> [String] {
        fields.filter { field($0, isNamed: lowercaseName) }.map(value)
    }

    /// Whether the method is `lowercaseMethod`'s upper-case form (methods are case-sensitive).
    public func methodIs(_ method: StaticString) -> Bool {
        guard methodRange.count == method.utf8CodeUnitCount else { return false }
        return bytes.withUnsafeBufferPointer { buf in
            method.withUTF8Buffer { m in
                for i in 0..<m.count where buf[methodRange.lowerBound + i] != m[i] { return false }
                return true
            }
        }
    }
}

/// Byte-level helpers shared by the codec and the header filter.
enum ASCII {
    static func lower(_ b: UInt8) -> UInt8 { (b >= 65 && b <= 90) ? b | 0x20 : b }

    /// Appends `n` in decimal digits (a `-` first when negative).
    static func appendDecimal(_ n: Int, to out: inout [UInt8]) {
        if n < 0 {
            out.append(UInt8(ascii: "-"))
            return appendDecimal(-n, to: &out)
        }
        if n >= 10 { appendDecimal(n / 10, to: &out) }
        out.append(UInt8(ascii: "0") + UInt8(n % 10))
    }

    /// The form for a name known only at run time. Labelled, so that a literal argument takes
    /// the `StaticString` form below (unlabelled, Swift would prefer `String` for a literal).
    static func equalsIgnoringCase(_ bytes: UnsafeBufferPointer<UInt8>, string lowercase: String) -> Bool {
        var lowercase = lowercase
        return lowercase.withUTF8 { equalsIgnoringCase(bytes, $0) }
    }

    /// The form for literals (field names on the hot path): no `String` is touched.
    @inline(__always)
    static func equalsIgnoringCase(_ bytes: UnsafeBufferPointer<UInt8>, _ lowercase: StaticString) -> Bool {
        equalsIgnoringCase(bytes, UnsafeBufferPointer(start: lowercase.utf8Start, count: lowercase.utf8CodeUnitCount))
    }

    static func equalsIgnoringCase(_ bytes: UnsafeBufferPointer<UInt8>, _ l: UnsafeBufferPointer<UInt8>) -> Bool {
        guard l.count == bytes.count else { return false }
        var i = 0
        if let a = bytes.baseAddress, let b = l.baseAddress, l.count >= 8 {
            while i + 8 <= l.count {
                if SWAR.lowercased(SWAR.load(a + i)) != SWAR.load(b + i) { return false }
                i += 8
            }
            // The last bytes as the word that ends them, overlapping bytes already compared.
            let last = l.count - 8
            return i == l.count || SWAR.lowercased(SWAR.load(a + last)) == SWAR.load(b + last)
        }
        while i < l.count {
            if lower(bytes[i]) != l[i] { return false }
            i += 1
        }
        return true
    }

    /// RFC 9110 §5.6.2 tchar: a bit of one of two masks (bytes 0–63 and 64–127; none from
    /// 0x80). Literals, neither a switch (a chain of compares per byte) nor a global table (a
    /// lazy-initialisation check per byte).
    @inline(__always)
    static func isTokenChar(_ b: UInt8) -> Bool {
        let low: UInt64 = 0x03FF_6CFA_0000_0000  // ! # $ % & ' * + - . DIGIT
        let high: UInt64 = 0x57FF_FFFF_C7FF_FFFE  // ALPHA ^ _ ` | ~
        return b < 0x80 && ((b < 0x40 ? low : high) >> UInt64(b & 0x3F)) & 1 != 0
    }

    /// The index of the first byte at or after `start` (below `count`) that is not a token
    /// character, or `count`: what `while i < count, isTokenChar(p[i]) { i += 1 }` finds,
    /// eight bytes at a time while they are letters and dashes (`SWAR.notLetterOrDash`),
    /// then byte by byte from the first other byte (a colon, usually).
    @inline(__always)
    static func tokenEnd(_ p: UnsafePointer<UInt8>, from start: Int, count: Int) -> Int {
        var i = start
        while i + 8 <= count {
            let mask = SWAR.notLetterOrDash(SWAR.load(UnsafeRawPointer(p + i)))
            if mask != 0 {
                i += SWAR.firstMatch(mask)
                break
            }
            i += 8
        }
        while i < count, isTokenChar(p[i]) { i += 1 }
        return i
    }

    /// Bytes allowed in a field value: VCHAR, obs-text, SP and HTAB — never NUL, CR, LF,
    /// other controls or DEL.
    static func isFieldValueByte(_ b: UInt8) -> Bool {
        b == 0x09 || (b >= 0x20 && b != 0x7F)
    }

    static func isHexDigit(_ b: UInt8) -> Bool { hexValue(b) != nil }

    static func hexValue(_ b: UInt8) -> UInt64? {
        switch b {
        case 48...57: return UInt64(b - 48)
        case 65...70: return UInt64(b - 55)
        case 97...102: return UInt64(b - 87)
        default: return nil
        }
    }
}

/// The top-level members of a JSON object whose values are strings or numbers (an OAuth 2.0
/// token response, RFC 6749 §5.1); nested objects and arrays are checked for balance and
/// skipped. Without Foundation's `JSONSerialization`, which would bring Foundation's
/// libraries into every Sluice process for the one response it reads.
///
/// Threading: a value; any thread.
public struct JSONObjectFields: Sendable {
    /// One member's value as far as a reader of this type needs it.
    public enum Value: Sendable, Equatable {
        case string(String)
        /// The number as written (`3600`, `3.6e3`).
        case number(String)
        /// `true`, `false`, `null`, an object or an array.
        case other
    }

    public private(set) var members: [String: Value] = [:]

    /// Nil unless `bytes` is one JSON object (whitespace around it allowed).
    public init?(_ bytes: [UInt8]) {
        var p = Parser(bytes: bytes)
        guard let members = p.object(), p.atEnd() else { return nil }
        self.members = members
    }

    public subscript(name: String) -> Value? { members[name] }

    /// The member as a string, if it is one.
    public func string(_ name: String) -> String? {
        if case .string(let s)? = members[name] { return s }
        return nil
    }

    /// The member as a whole number: a JSON number (a fraction truncated) or a string of
    /// digits; nil otherwise.
    public func integer(_ name: String) -> Int? {
        switch members[name] {
        case .number(let text)?:
            if let n = Int(text) { return n }
            guard let d = Double(text), d.isFinite, abs(d) < 9e18 else { return nil }
            return Int(d)
        case .string(let text)?: return Int(text)
        default: return nil
        }
    }

    private struct Parser {
        let bytes: [UInt8]
        var i = 0
        static let maxDepth = 64

        mutating func skipSpace() {
            while i < bytes.count, bytes[i] == 0x20 || bytes[i] == 0x09 || bytes[i] == 0x0A || bytes[i] == 0x0D { i += 1 }
        }

        mutating func atEnd() -> Bool {
            skipSpace()
            return i == bytes.count
        }

        mutating func object() -> [String: Value]? {
            skipSpace()
            guard i < bytes.count, bytes[i] == UInt8(ascii: "{") else { return nil }
            i += 1
            var out: [String: Value] = [:]
            skipSpace()
            if i < bytes.count, bytes[i] == UInt8(ascii: "}") {
                i += 1
                return out
            }
            while true {
                skipSpace()
                guard let key = string() else { return nil }
                skipSpace()
                guard i < bytes.count, bytes[i] == UInt8(ascii: ":") else { return nil }
                i += 1
                skipSpace()
                guard let value = value(depth: 1) else { return nil }
                out[key] = value
                skipSpace()
                guard i < bytes.count else { return nil }
                if bytes[i] == UInt8(ascii: "}") {
                    i += 1
                    return out
                }
                guard bytes[i] == UInt8(ascii: ",") else { return nil }
                i += 1
            }
        }

        mutating func value(depth: Int) -> Value? {
            guard i < bytes.count, depth <= Self.maxDepth else { return nil }
            switch bytes[i] {
            case UInt8(ascii: "\""): return string().map { .string($0) }
            case UInt8(ascii: "{"), UInt8(ascii: "["): return skipCollection(depth: depth) ? .other : nil
            case UInt8(ascii: "t"): return word("true")
            case UInt8(ascii: "f"): return word("false")
            case UInt8(ascii: "n"): return word("null")
            default: return number()
            }
        }

        mutating func word(_ w: StaticString) -> Value? {
            let n = w.utf8CodeUnitCount
            guard i + n <= bytes.count, bytes[i..<(i + n)].elementsEqual(UnsafeBufferPointer(start: w.utf8Start, count: n)) else {
                return nil
            }
            i += n
            return .other
        }

        mutating func number() -> Value? {
            let start = i
            while i < bytes.count,
                bytes[i] == UInt8(ascii: "-") || bytes[i] == UInt8(ascii: "+") || bytes[i] == UInt8(ascii: ".")
                    || bytes[i] == UInt8(ascii: "e") || bytes[i] == UInt8(ascii: "E") || (bytes[i] >= 0x30 && bytes[i] <= 0x39)
            {
                i += 1
            }
            let text = String(decoding: bytes[start..<i], as: UTF8.self)
            return i > start && Double(text) != nil ? .number(text) : nil
        }

        mutating func skipCollection(depth: Int) -> Bool {
            let close = bytes[i] == UInt8(ascii: "{") ? UInt8(ascii: "}") : UInt8(ascii: "]")
            let isObject = close == UInt8(ascii: "}")
            i += 1
            skipSpace()
            if i < bytes.count, bytes[i] == close {
                i += 1
                return true
            }
            while true {
                skipSpace()
                if isObject {
                    guard string() != nil else { return false }
                    skipSpace()
                    guard i < bytes.count, bytes[i] == UInt8(ascii: ":") else { return false }
                    i += 1
                    skipSpace()
                }
                guard value(depth: depth + 1) != nil else { return false }
                skipSpace()
                guard i < bytes.count else { return false }
                if bytes[i] == close {
                    i += 1
                    return true
                }
                guard bytes[i] == UInt8(ascii: ",") else { return false }
                i += 1
            }
        }

        mutating func string() -> String? {
            guard i < bytes.count, bytes[i] == UInt8(ascii: "\"") else { return nil }
            i += 1
            guard case .success(let out) = JSONStringLiteral.decode(bytes, from: &i) else { return nil }
            return String(validating: out, as: UTF8.self)
        }
    }
}

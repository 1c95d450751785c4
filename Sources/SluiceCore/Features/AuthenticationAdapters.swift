import HTTPTypes

/// The `bearer` adapter: `Authorization: Bearer <token>`, replacing any client-sent value.
public struct BearerAdapter: HeaderEditingAdapter {
    public var name: String { "bearer" }
    public let token: Secret
    public init(token: Secret) { self.token = token }
    public var headerEdits: [HeaderEdit]? { [.set(.authorization, "Bearer " + token.value)] }

    public func adaptInPlace(_ request: inout ProxyRequest) throws(AdaptationError) -> Bool {
        request.headerFields[.authorization] = "Bearer " + token.value
        return true
    }
}

/// The `basic` adapter: `Authorization: Basic base64(username:password)` (RFC 7617).
public struct BasicAuthAdapter: HeaderEditingAdapter {
    public var name: String { "basic" }
    public let username: String
    public let password: Secret
    /// Computed once at load: the per-request cost is one field assignment.
    private let headerValue: String

    public init(username: String, password: Secret) {
        self.username = username
        self.password = password
        headerValue = "Basic " + Base64.encode(Array("\(username):\(password.value)".utf8))
    }

    public var headerEdits: [HeaderEdit]? { [.set(.authorization, headerValue)] }

    public func adaptInPlace(_ request: inout ProxyRequest) throws(AdaptationError) -> Bool {
        request.headerFields[.authorization] = headerValue
        return true
    }
}

/// The `api_key` adapter: the key as a header, or as a query parameter (added, or replacing
/// a parameter of the same name).
public struct APIKeyAdapter: HeaderEditingAdapter {
    public enum Placement: Sendable, Equatable {
        case header(String)
        case query(String)
    }
    public var name: String { "api_key" }
    public let placement: Placement
    public let value: Secret

    public init(placement: Placement, value: Secret) {
        self.placement = placement
        self.value = value
    }

    public var headerEdits: [HeaderEdit]? {
        guard case .header(let header) = placement, let field = HTTPField.Name(header) else { return nil }
        return [.set(field, value.value)]
    }

    public func adaptInPlace(_ request: inout ProxyRequest) throws(AdaptationError) -> Bool {
        switch placement {
        case .header(let header):
            guard let field = HTTPField.Name(header) else {
                throw AdaptationError(adapter: name, reason: "invalid header name")
            }
            request.headerFields[field] = value.value
        case .query(let parameter):
            request.url = QueryString.replacing(
                parameter, with: PercentEncoding.encodeQueryValue(value.value),
                in: request.url)
        }
        return true
    }
}

/// Query-string editing on absolute URLs, keeping everything else byte for byte.
public enum QueryString {
    /// `url` with every `name=…` parameter removed and `name=encodedValue` appended.
    public static func replacing(_ name: String, with encodedValue: String, in url: String) -> String {
        let fragmentStart = url.firstIndex(of: "#") ?? url.endIndex
        let beforeFragment = url[..<fragmentStart]
        let fragment = url[fragmentStart...]
        guard let q = beforeFragment.firstIndex(of: "?") else {
            return beforeFragment + "?" + name + "=" + encodedValue + fragment
        }
        let base = beforeFragment[..<q]
        let kept = beforeFragment[beforeFragment.index(after: q)...].split(separator: "&", omittingEmptySubsequences: true)
            .filter { parameterName($0) != name }
        let query = (kept.map(String.init) + [name + "=" + encodedValue]).joined(separator: "&")
        return base + "?" + query + fragment
    }

    /// `url` with the values of the named parameters replaced by `replacement`.
    public static func redacting(_ names: Set<String>, in url: String, replacement: String = "<redacted>") -> String {
        guard !names.isEmpty, let q = url.firstIndex(of: "?") else { return url }
        let fragmentStart = url.firstIndex(of: "#") ?? url.endIndex
        let parts = url[url.index(after: q)..<fragmentStart].split(separator: "&", omittingEmptySubsequences: false)
        let query = parts.map { part -> String in
            names.contains(parameterName(part)) ? parameterName(part) + "=" + replacement : String(part)
        }.joined(separator: "&")
        return url[...q] + query + url[fragmentStart...]
    }

    static func parameterName(_ part: Substring) -> String {
        String(part[..<(part.firstIndex(of: "=") ?? part.endIndex)])
    }
}

public enum PercentEncoding {
    /// Encodes everything but RFC 3986 unreserved characters.
    public static func encodeQueryValue(_ s: String) -> String {
        var out = ""
        for b in s.utf8 {
            switch b {
            case 0x30...0x39, 0x41...0x5A, 0x61...0x7A, 0x2D, 0x2E, 0x5F, 0x7E:
                out.unicodeScalars.append(Unicode.Scalar(b))
            default:
                let hex = Array("0123456789ABCDEF".utf8)
                out.unicodeScalars.append("%")
                out.unicodeScalars.append(Unicode.Scalar(hex[Int(b >> 4)]))
                out.unicodeScalars.append(Unicode.Scalar(hex[Int(b & 0xF)]))
            }
        }
        return out
    }
    /// `%XX` sequences decoded; nil when one is malformed or the result is not UTF-8 (as
    /// Foundation's `removingPercentEncoding`).
    public static func decode(_ s: String) -> String? {
        let bytes = Array(s.utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var i = 0
        while i < bytes.count {
            guard bytes[i] == UInt8(ascii: "%") else {
                out.append(bytes[i])
                i += 1
                continue
            }
            guard i + 2 < bytes.count, let high = hexValue(bytes[i + 1]), let low = hexValue(bytes[i + 2]) else { return nil }
            out.append(high << 4 | low)
            i += 3
        }
        return String(validating: out, as: UTF8.self)
    }

    private static func hexValue(_ b: UInt8) -> UInt8? {
        switch b {
        case 0x30...0x39: return b - 0x30
        case 0x41...0x46: return b - 0x41 + 10
        case 0x61...0x66: return b - 0x61 + 10
        default: return nil
        }
    }
}

public enum Base64 {
    public static func encode(_ bytes: [UInt8]) -> String {
        let table = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var i = 0
        while i + 2 < bytes.count {
            let n = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2])
            out += [table[Int(n >> 18 & 63)], table[Int(n >> 12 & 63)], table[Int(n >> 6 & 63)], table[Int(n & 63)]]
            i += 3
        }
        let rest = bytes.count - i
        if rest == 1 {
            let n = UInt32(bytes[i]) << 16
            out += [table[Int(n >> 18 & 63)], table[Int(n >> 12 & 63)], 61, 61]
        } else if rest == 2 {
            let n = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8
            out += [table[Int(n >> 18 & 63)], table[Int(n >> 12 & 63)], table[Int(n >> 6 & 63)], 61]
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Standard alphabet, padding optional; nil for any other character.
    public static func decode(_ text: String) -> [UInt8]? {
        var out: [UInt8] = []
        var acc: UInt32 = 0
        var bits = 0
        var padding = 0
        for c in text.utf8 {
            let v: UInt32
            switch c {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): v = UInt32(c - UInt8(ascii: "A"))
            case UInt8(ascii: "a")...UInt8(ascii: "z"): v = UInt32(c - UInt8(ascii: "a")) + 26
            case UInt8(ascii: "0")...UInt8(ascii: "9"): v = UInt32(c - UInt8(ascii: "0")) + 52
            case UInt8(ascii: "+"): v = 62
            case UInt8(ascii: "/"): v = 63
            case UInt8(ascii: "="):
                padding += 1
                continue
            default: return nil
            }
            guard padding == 0 else { return nil }
            acc = acc << 6 | v
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(truncatingIfNeeded: acc >> UInt32(bits)))
            }
        }
        return padding <= 2 ? out : nil
    }
}

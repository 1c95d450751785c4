import SluiceCore

/// The request-target forms a forward proxy accepts (RFC 9112 §3.2): absolute-form for
/// ordinary requests and authority-form for CONNECT. Origin-form and asterisk-form are
/// for origin servers and are refused on a forward listener.
struct RequestTarget: Equatable {
    enum Scheme: Equatable { case http, https }

    var scheme: Scheme
    /// Host as written, without brackets for IPv6 literals.
    var host: String
    var port: Int
    /// The URL handed to the session core: the client's target with the scheme lower-cased.
    var url: String

    /// `host:port` for messages and logs; IPv6 literals in brackets.
    var authority: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }

    /// Parses an absolute-form target (`http://host[:port]/path?query`).
    static func absolute(_ target: String) throws(ProxyError) -> RequestTarget {
        guard let colon = target.firstIndex(of: ":") else {
            throw target.hasPrefix("/") || target == "*" ? .notAbsoluteURL : .badURL("malformed request target")
        }
        let schemeText = target[..<colon].lowercased()
        let scheme: Scheme
        switch schemeText {
        case "http": scheme = .http
        case "https": scheme = .https
        default: throw .badURL("unsupported URL scheme '\(schemeText)' (http and https are)")
        }
        let rest = target[target.index(after: colon)...]
        guard rest.hasPrefix("//") else { throw .badURL("malformed absolute URL") }
        let afterSlashes = rest.dropFirst(2)
        let authorityEnd = afterSlashes.firstIndex { $0 == "/" || $0 == "?" || $0 == "#" } ?? afterSlashes.endIndex
        let authority = afterSlashes[..<authorityEnd]
        if authority.contains("@") { throw .badURL("credentials in the URL are not allowed") }
        if afterSlashes[authorityEnd...].contains("#") { throw .badURL("fragment in request target") }
        let (host, port) = try parseAuthority(authority, defaultPort: scheme == .http ? 80 : 443)
        return RequestTarget(scheme: scheme, host: host, port: port,
                             url: schemeText + target[colon...])
    }

    /// Parses an authority-form target (`host:port`, `[v6]:port`) for CONNECT; the port is required.
    static func authority(_ target: String) throws(ProxyError) -> RequestTarget {
        let (host, port) = try parseAuthority(Substring(target), defaultPort: nil)
        return RequestTarget(scheme: .https, host: host, port: port, url: target)
    }

    private static func parseAuthority(_ text: Substring, defaultPort: Int?) throws(ProxyError) -> (String, Int) {
        var host: Substring
        var portText: Substring?
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else { throw .badURL("malformed IPv6 host") }
            host = text[text.index(after: text.startIndex)..<close]
            let after = text[text.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { throw .badURL("malformed authority") }
                portText = after.dropFirst()
            }
            guard IPNetwork.parseAddress(String(host))?.count == 16 else { throw .badURL("malformed IPv6 host") }
        } else {
            if let colon = text.lastIndex(of: ":") {
                host = text[..<colon]
                portText = text[text.index(after: colon)...]
            } else {
                host = text
            }
            let valid = host.utf8.allSatisfy { b in
                (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A)
                    || b == 0x2D || b == 0x2E || b == 0x5F
            }
            guard valid else { throw .badURL("invalid host name") }
        }
        guard !host.isEmpty else { throw .badURL("empty host") }
        let port: Int
        if let portText, !portText.isEmpty || defaultPort == nil {
            guard portText.count <= 5, portText.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }),
                  let p = Int(portText), p > 0, p <= 65535
            else { throw .badURL("invalid port") }
            port = p
        } else if let defaultPort {
            port = defaultPort
        } else {
            throw .badURL("CONNECT needs host:port")
        }
        return (String(host), port)
    }
}

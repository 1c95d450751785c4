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

    /// `host:port` for messages and logs; IPv6 literals in brackets (a byte test: no
    /// Foundation search per request).
    var authority: String { host.utf8.contains(0x3A) ? "[\(host)]:\(port)" : "\(host):\(port)" }

    /// The path and query of `url` (`/` when it has none), for a request line Sluice writes
    /// itself (an upgrade handshake).
    var originForm: String {
        var out = ""
        withOriginForm { out += String(decoding: $0, as: UTF8.self) }
        return out
    }

    /// Calls `body` with the origin form's bytes: once with `/` when the path is empty, then
    /// with the path and query as they stand in `url` (no copy, no string built: the native
    /// transport writes its request line with it). With `absolute`, once with the whole `url`
    /// instead (the absolute form, for a request line to a proxy: a peer of the fleet).
    func withOriginForm(orAbsolute absolute: Bool = false, _ body: (UnsafeRawBufferPointer) -> Void) {
        var url = url
        url.withUTF8 { t in
            if absolute { return body(UnsafeRawBufferPointer(t)) }
            // After "://", the first "/" or "?" starts the origin form.
            var i = 0
            while i + 2 < t.count, !(t[i] == 0x3A && t[i + 1] == 0x2F && t[i + 2] == 0x2F) { i += 1 }
            i += 3
            while i < t.count, t[i] != 0x2F, t[i] != 0x3F { i += 1 }
            if i >= t.count || t[i] == 0x3F {
                withUnsafeBytes(of: UInt8(0x2F)) { body($0) }
            }
            if i < t.count { body(UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(t)[i...])) }
        }
    }

    /// Parses an absolute-form target (`http://host[:port]/path?query`). Byte-level: this
    /// runs for every request.
    static func absolute(_ target: String) throws(ProxyError) -> RequestTarget {
        var utf8 = target  // `withUTF8` is mutating (it may make the string native)
        let result: Result<RequestTarget, ProxyError> = utf8.withUTF8 { t in
            do throws(ProxyError) {
                return .success(try absolute(utf8: t, received: target))
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }

    /// `t` is `received`'s UTF-8: the URL is `received` itself when its scheme is already
    /// lower case (a second string of the same bytes cost an allocation and a validation).
    private static func absolute(
        utf8 t: UnsafeBufferPointer<UInt8>, received: String
    ) throws(ProxyError)
        -> RequestTarget
    {
        do {
            guard let colon = t.firstIndex(of: UInt8(ascii: ":")) else {
                throw t.first == UInt8(ascii: "/") || (t.count == 1 && t[0] == UInt8(ascii: "*"))
                    ? .notAbsoluteURL : .badURL("malformed request target")
            }
            let scheme: Scheme
            if colon == 4, ASCII.equalsIgnoringCase(UnsafeBufferPointer(rebasing: t[0..<4]), "http") {
                scheme = .http
            } else if colon == 5, ASCII.equalsIgnoringCase(UnsafeBufferPointer(rebasing: t[0..<5]), "https") {
                scheme = .https
            } else {
                let name = String(decoding: t[0..<colon], as: UTF8.self).lowercased()
                throw .badURL("unsupported URL scheme '\(name)' (http and https are)")
            }
            guard colon + 2 < t.count, t[colon + 1] == UInt8(ascii: "/"), t[colon + 2] == UInt8(ascii: "/") else {
                throw .badURL("malformed absolute URL")
            }
            let authorityStart = colon + 3
            var authorityEnd = authorityStart
            while authorityEnd < t.count, t[authorityEnd] != UInt8(ascii: "/"), t[authorityEnd] != UInt8(ascii: "?"),
                t[authorityEnd] != UInt8(ascii: "#")
            {
                if t[authorityEnd] == UInt8(ascii: "@") { throw .badURL("credentials in the URL are not allowed") }
                authorityEnd += 1
            }
            if t[authorityEnd...].contains(UInt8(ascii: "#")) { throw .badURL("fragment in request target") }
            let (host, port) = try parseAuthority(
                UnsafeBufferPointer(rebasing: t[authorityStart..<authorityEnd]),
                defaultPort: scheme == .http ? 80 : 443)
            // The URL as received, with the scheme lower-cased (curl is picky about nothing else).
            let url =
                colon == 4 && t[0] == UInt8(ascii: "h") && t[1] == UInt8(ascii: "t") && t[2] == UInt8(ascii: "t")
                    && t[3] == UInt8(ascii: "p")
                    || colon == 5 && t[0] == UInt8(ascii: "h") && t[4] == UInt8(ascii: "s")
                        && t[1] == UInt8(ascii: "t") && t[2] == UInt8(ascii: "t") && t[3] == UInt8(ascii: "p")
                ? received
                : (scheme == .http ? "http" : "https") + String(decoding: t[colon...], as: UTF8.self)
            return RequestTarget(scheme: scheme, host: host, port: port, url: url)
        }
    }

    /// The target a host's `upstream:` override sends a request to: the scheme changed, the
    /// port from the override, else the URL's explicit port, else the new scheme's default.
    func overridden(by override: UpstreamOverride) throws(ProxyError) -> RequestTarget {
        let newScheme: Scheme =
            switch override.scheme {
            case .https?: .https
            case .http?: .http
            case nil: scheme
            }
        guard scheme != newScheme || override.port != nil else { return self }
        let afterScheme = url[url.index(url.startIndex, offsetBy: scheme == .http ? 7 : 8)...]
        let authorityEnd = afterScheme.firstIndex { $0 == "/" || $0 == "?" } ?? afterScheme.endIndex
        let authority = afterScheme[..<authorityEnd]
        let hostEnd = authority.lastIndex(of: "]") ?? authority.startIndex
        let explicitPort = authority[hostEnd...].utf8.contains(0x3A)
        let newPort = override.port ?? (explicitPort ? port : (newScheme == .https ? 443 : 80))
        let hostText = host.utf8.contains(0x3A) ? "[\(host)]" : host
        let name = newScheme == .https ? "https" : "http"
        return try RequestTarget.absolute("\(name)://\(hostText):\(newPort)" + afterScheme[authorityEnd...])
    }

    /// Parses an authority-form target (`host:port`, `[v6]:port`) for CONNECT; the port is required.
    static func authority(_ target: String) throws(ProxyError) -> RequestTarget {
        var text = target
        let result: Result<(String, Int), ProxyError> = text.withUTF8 { bytes in
            do throws(ProxyError) {
                return .success(try parseAuthority(bytes, defaultPort: nil))
            } catch {
                return .failure(error)
            }
        }
        let (host, port) = try result.get()
        return RequestTarget(scheme: .https, host: host, port: port, url: target)
    }

    /// `host[:port]` or `[v6][:port]`, as bytes: the host (brackets removed) and the port (the
    /// scheme's default when absent or empty; required when `defaultPort` is nil).
    private static func parseAuthority(_ a: UnsafeBufferPointer<UInt8>, defaultPort: Int?) throws(ProxyError) -> (String, Int) {
        let host: String
        var portStart: Int?
        if a.first == UInt8(ascii: "[") {
            guard let close = a.firstIndex(of: UInt8(ascii: "]")) else { throw .badURL("malformed IPv6 host") }
            if close + 1 < a.count {
                guard a[close + 1] == UInt8(ascii: ":") else { throw .badURL("malformed authority") }
                portStart = close + 2
            }
            host = String(decoding: UnsafeBufferPointer(rebasing: a[1..<close]), as: UTF8.self)
            guard IPNetwork.parseAddress(host)?.count == 16 else { throw .badURL("malformed IPv6 host") }
        } else {
            var hostEnd = a.count
            if let colon = a.lastIndex(of: UInt8(ascii: ":")) {
                hostEnd = colon
                portStart = colon + 1
            }
            for i in 0..<hostEnd {
                let b = a[i]
                let valid =
                    (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A)
                    || b == 0x2D || b == 0x2E || b == 0x5F
                guard valid else { throw .badURL("invalid host name") }
            }
            host = String(decoding: UnsafeBufferPointer(rebasing: a[0..<hostEnd]), as: UTF8.self)
        }
        guard !host.isEmpty else { throw .badURL("empty host") }
        if let portStart, portStart < a.count || defaultPort == nil {
            let digits = a.count - portStart
            guard digits >= 1, digits <= 5 else { throw .badURL("invalid port") }
            var port = 0
            for i in portStart..<a.count {
                guard a[i] >= 0x30, a[i] <= 0x39 else { throw .badURL("invalid port") }
                port = port * 10 + Int(a[i] - 0x30)
            }
            guard port > 0, port <= 65535 else { throw .badURL("invalid port") }
            return (host, port)
        }
        guard let defaultPort else { throw .badURL("CONNECT needs host:port") }
        return (host, defaultPort)
    }
}

import HTTPTypes

/// Decides what happens to a 3xx from the origin (Alamofire's `RedirectHandler`).
public protocol RedirectHandler: Sendable {
    /// The request to send next for a redirect `status` to `location` (already resolved to an
    /// absolute URL), or `nil` to pass the 3xx to the client. `hops` counts redirects already
    /// followed in this exchange.
    func redirect(_ request: ProxyRequest, status: Int, location: String, hops: Int) -> ProxyRequest?
}

/// The built-in redirect handler: `do_not_follow`, `follow` or `modify` (follow after
/// rewriting the `Location`).
public struct Redirector: RedirectHandler, Equatable {
    public struct Rewrite: Sendable, Equatable {
        public var from: String
        public var to: String
        public init(from: String, to: String) {
            self.from = from
            self.to = to
        }
    }

    public enum Behavior: Sendable, Equatable {
        /// A 3xx goes to the client unchanged: the default for a proxy, whose clients follow
        /// redirects themselves.
        case doNotFollow
        /// Follow up to `max` hops.
        case follow(max: Int)
        /// Follow up to `max` hops, rewriting each `Location` that starts with a rule's `from`.
        case modify(max: Int, rewrites: [Rewrite])
    }

    /// `10` hops by default, as curl and browsers limit.
    public static let defaultMaxHops = 10
    public static let doNotFollow = Redirector(behavior: .doNotFollow)
    public static let follow = Redirector(behavior: .follow(max: defaultMaxHops))

    /// Fields dropped when a redirect changes host: credentials meant for the first origin.
    public static let crossHostDroppedFields: [HTTPField.Name] = [.authorization, .cookie]

    public let behavior: Behavior
    public init(behavior: Behavior) { self.behavior = behavior }

    public var follows: Bool { behavior != .doNotFollow }

    public func redirect(_ request: ProxyRequest, status: Int, location: String, hops: Int) -> ProxyRequest? {
        let max: Int
        var target = location
        switch behavior {
        case .doNotFollow: return nil
        case .follow(let m): max = m
        case .modify(let m, let rewrites):
            max = m
            if let rule = rewrites.first(where: { target.hasPrefix($0.from) }) {
                target = rule.to + target.dropFirst(rule.from.count)
            }
        }
        guard hops < max, [301, 302, 303, 307, 308].contains(status) else { return nil }
        let lower = target.lowercased()
        guard lower.hasPrefix("http://") || lower.hasPrefix("https://") else { return nil }

        var next = request
        next.url = target
        if status == 303 || ((status == 301 || status == 302) && request.method == "POST") {
            next.method = request.method == "HEAD" ? "HEAD" : "GET"
            next.body = .none
            next.bodyEncoders = []
            next.headerFields[.contentType] = nil
            next.headerFields[.contentEncoding] = nil
        }
        if URLParts(target).host != request.host {
            for name in Self.crossHostDroppedFields { next.headerFields[name] = nil }
        }
        return next
    }

    /// Resolves a `Location` value against the URL it came from (RFC 3986 §5, for the forms
    /// servers send: absolute, scheme-relative, absolute-path and relative-path references).
    public static func resolve(_ location: String, against base: String) -> String {
        // Any reference with a scheme (RFC 3986 §3.1) is absolute: ftp:, mailto:, … are kept
        // as they are, and `redirect` then refuses to follow them.
        if let colon = location.firstIndex(of: ":"), let first = location.first, first.isLetter,
            location[..<colon].allSatisfy({ $0.isLetter || $0.isNumber || $0 == "+" || $0 == "-" || $0 == "." })
        {
            return location
        }
        let parts = URLParts(base)
        if location.hasPrefix("//") { return parts.scheme + ":" + location }
        let origin = parts.scheme + "://" + parts.authority
        if location.hasPrefix("/") { return origin + location }
        let path = parts.pathAndQuery.prefix { $0 != "?" }
        if location.hasPrefix("?") { return origin + path + location }
        let directory = path.lastIndex(of: "/").map { path[...$0] } ?? "/"
        return origin + directory + location
    }
}

extension RedirectHandler where Self == Redirector {
    public static var doNotFollow: Redirector { Redirector.doNotFollow }
    public static var follow: Redirector { Redirector.follow }
}

import HTTPTypes

/// A request on its way upstream, as the pipeline sees it: what adapters read and change.
///
/// Built once per client request on the worker's thread from the parsed head; hop-by-hop
/// fields and `Host` are already gone (the session core sets framing and `Host` itself).
public struct ProxyRequest: Sendable {
    /// Unique per process; appears in every event and log line of this exchange.
    public let id: UInt64
    public var method: String
    /// The absolute URL sent upstream.
    public var url: String
    public var headerFields: HTTPFields
    public var body: Body
    /// Streaming encoders the body passes through on its way upstream, in order.
    public var bodyEncoders: [any BodyEncoderFactory]
    /// The body an every-try adapter gave this try instead of the one read
    /// (`TryContext.body`): a `lua` script's `req:set_body`. The try sends it, with its
    /// length; nil: the body as read. Each try starts again without it.
    public var replacedBody: [UInt8]?
    /// How deep a `lua` sub-request this request is (`LuaSubrequest.depth(fromHeader:)`): 0 for
    /// a client's; the depth header itself is never among `headerFields`.
    public var scriptDepth = 0

    public enum Body: Sendable, Equatable {
        case none
        /// A body of known length (`Content-Length`).
        case length(Int64)
        /// A body of unknown length (chunked from the client, or re-encoded by an adapter).
        case streamed
    }

    public init(id: UInt64, method: String, url: String, headerFields: HTTPFields, body: Body) {
        self.id = id
        self.method = method
        self.url = url
        self.headerFields = headerFields
        self.body = body
        self.bodyEncoders = []
    }

    /// The URL's host (no port, no brackets), lower-cased.
    public var host: String { URLParts(url).host }
}

/// Makes one streaming encoder per request body (an encoder holds per-stream state).
public protocol BodyEncoderFactory: Sendable {
    var name: String { get }
    func makeEncoder() -> any BodyEncoder
}

/// A streaming body transformation (deflate, …). Owned by one exchange on one worker thread.
public protocol BodyEncoder: AnyObject {
    /// Encodes `input`, appending output to `output`; `finish` flushes the stream's end.
    func encode(_ input: UnsafeRawBufferPointer, finish: Bool, into output: inout [UInt8]) throws
}

/// Minimal, allocation-light splitting of an absolute http(s) URL.
public struct URLParts: Sendable {
    public var scheme: Substring
    public var host: String
    /// `host[:port]` as written.
    public var authority: Substring
    /// Path and query, starting at `/` or `?` (or empty).
    public var pathAndQuery: Substring

    public init(_ url: String) {
        let schemeEnd = url.firstIndex(of: ":") ?? url.startIndex
        scheme = url[..<schemeEnd]
        var rest = url[schemeEnd...].dropFirst()
        if rest.hasPrefix("//") { rest = rest.dropFirst(2) }
        let authorityEnd = rest.firstIndex { $0 == "/" || $0 == "?" || $0 == "#" } ?? rest.endIndex
        authority = rest[..<authorityEnd]
        pathAndQuery = rest[authorityEnd...]
        var h = authority
        if let at = h.lastIndex(of: "@") { h = h[h.index(after: at)...] }
        if h.hasPrefix("["), let close = h.firstIndex(of: "]") {
            h = h[h.index(after: h.startIndex)..<close]
        } else if let colon = h.lastIndex(of: ":") {
            h = h[..<colon]
        }
        host = h.lowercased()
    }
}

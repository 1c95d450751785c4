/// A configured secret (a token, a password, an API key). Its description is always
/// `<redacted>`, so printing a configuration, a policy or an error never shows it; only the
/// adapter that applies it reads `value`.
public struct Secret: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible {
    public let value: String
    /// Where it came from (`${API_TOKEN}`, `file:/etc/…`, or `inline`), safe to print.
    public let source: String

    public init(_ value: String, source: String = "inline") {
        self.value = value
        self.source = source
    }

    public var description: String { "<redacted>" }
    public var debugDescription: String { "<redacted>" }
}

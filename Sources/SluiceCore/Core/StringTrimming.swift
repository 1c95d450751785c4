extension StringProtocol {
    /// The text without the whitespace (spaces, tabs, line breaks) at either end: what
    /// Foundation's `trimmingCharacters(in: .whitespacesAndNewlines)` gives, without Foundation.
    public func trimmingWhitespace() -> String {
        var s = self[...]
        while s.first?.isWhitespace == true { s = s.dropFirst() }
        while s.last?.isWhitespace == true { s = s.dropLast() }
        return String(s)
    }
}

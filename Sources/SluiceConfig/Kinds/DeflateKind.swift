import SluiceCore

/// `deflate` (docs/configuration.md, "Adapters"): the request body compressed as it streams
/// (`DeflateRequestCompressor`). A bare `- deflate` takes the defaults.
enum DeflateKind: InterceptorKind {
    static var name: String { "deflate" }

    static func read(_ settings: YAMLNode?, at entry: YAMLNode, _ reader: inout NodeReader) -> DeflateRequestCompressor? {
        var minBytes = DeflateRequestCompressor.defaultMinBytes
        var behavior = DeflateRequestCompressor.defaultDuplicateHeaderBehavior
        if let settings, !(settings.scalar.map { $0.string.isEmpty } ?? false) {
            reader.entries(settings, in: "deflate", known: ["min_bytes", "duplicate_header"]) { r, key, value in
                if key == "min_bytes" {
                    if let n = r.size(value, key: key, min: 0) { minBytes = n }
                } else if let text = value.scalar?.string,
                    let b = DeflateRequestCompressor.DuplicateHeaderBehavior(rawValue: text)
                {
                    behavior = b
                } else {
                    r.fail(value, "duplicate_header must be error, replace or skip")
                }
            }
        }
        return DeflateRequestCompressor(minBytes: minBytes, duplicateHeaderBehavior: behavior)
    }

    static func describe(_ a: DeflateRequestCompressor) -> String {
        "min_bytes \(a.minBytes), duplicate_header \(a.duplicateHeaderBehavior.rawValue)"
    }
}

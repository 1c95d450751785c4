import HTTPTypes

/// One fixed change to request header fields.
public enum HeaderEdit: Sendable {
    /// Drop every field with the name.
    case remove(HTTPField.Name)
    /// Replace every field with the name by one with this value.
    case set(HTTPField.Name, String)
    /// Add a field, keeping any with the same name.
    case add(HTTPField.Name, String)
}

/// An adapter whose whole effect is the same header edits on every request (`headers`,
/// `bearer`, `basic`, `api_key` as a header). A policy made only of such adapters lets the
/// engine apply them while it builds the upstream header lines from the client's bytes,
/// without building the request as `HTTPFields` first (the hot path's largest cost).
public protocol HeaderEditingAdapter: SynchronousRequestAdapter {
    /// The edits, in order; nil when this instance's effect is not a fixed header edit
    /// (an `api_key` in the query).
    var headerEdits: [HeaderEdit]? { get }
}

/// A sequence of header edits composed into one pass: the client's fields whose names are
/// replaced are dropped, then the resulting fields are appended. Equivalent to applying the
/// edits one by one to the fields (up to the position of replaced fields, which HTTP leaves
/// without meaning across different names).
///
/// A class: made once per policy and never changed, it travels by reference in the
/// machine's answers and the exchange's forwarded lines (as a struct in an enum payload it
/// was copied through the enum's value witness, ~400 instructions a request).
public final class HeaderEditPlan: Sendable {
    /// Lower-cased names (bytes) whose fields from the client are dropped.
    public let replacedNames: [[UInt8]]
    /// The fields the edits leave, appended after the client's, in order.
    public let appended: [(name: String, value: String)]
    /// `appended` as bytes, back to back (each name, then its value), and where each lies in
    /// them: the forwarded lines copy them per request without a `String` (iterating the
    /// pairs retained and released both strings of each, some 60 instructions a field).
    public let appendedBytes: [UInt8]
    public let appendedRanges: [(name: Range<Int>, value: Range<Int>)]

    public init(_ edits: [HeaderEdit]) {
        var order: [String] = []
        var entries: [String: (replaced: Bool, fields: [(String, String)])] = [:]
        func touch(_ key: String) { if entries[key] == nil { order.append(key) } }
        for edit in edits {
            switch edit {
            case .remove(let name):
                touch(name.canonicalName)
                entries[name.canonicalName] = (true, [])
            case .set(let name, let value):
                touch(name.canonicalName)
                entries[name.canonicalName] = (true, [(name.rawName, value)])
            case .add(let name, let value):
                touch(name.canonicalName)
                entries[name.canonicalName, default: (false, [])].fields.append((name.rawName, value))
            }
        }
        replacedNames = order.filter { entries[$0]!.replaced }.map { Array($0.utf8) }
        // Values as `HTTPField` legalizes them on the model path (control characters become
        // spaces, surrounding whitespace trimmed): no header injection through a configured value.
        appended = order.flatMap {
            entries[$0]!.fields.map { name, value in
                (name: name, value: HTTPField.Name(name).map { HTTPField(name: $0, value: value).value } ?? value)
            }
        }
        var bytes: [UInt8] = []
        var ranges: [(name: Range<Int>, value: Range<Int>)] = []
        for (name, value) in appended {
            let nameStart = bytes.count
            bytes += name.utf8
            let valueStart = bytes.count
            bytes += value.utf8
            ranges.append((nameStart..<valueStart, valueStart..<bytes.count))
        }
        appendedBytes = bytes
        appendedRanges = ranges
    }

    /// Whether a client field named `name` (any case) is dropped.
    @inlinable
    public func replaces(_ name: UnsafeBufferPointer<UInt8>) -> Bool {
        for candidate in replacedNames where candidate.count == name.count {
            var same = true
            for i in 0..<name.count {
                var b = name[i]
                if b >= 0x41 && b <= 0x5A { b |= 0x20 }
                if b != candidate[i] {
                    same = false
                    break
                }
            }
            if same { return true }
        }
        return false
    }

    /// The composed plan of adapters that are all header editors, else nil.
    public static func of(_ adapters: [any RequestAdapter]) -> HeaderEditPlan? {
        var edits: [HeaderEdit] = []
        for adapter in adapters {
            guard let editor = adapter as? any HeaderEditingAdapter, let more = editor.headerEdits else { return nil }
            edits += more
        }
        return HeaderEditPlan(edits)
    }
}

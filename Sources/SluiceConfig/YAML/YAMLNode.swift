/// Where a node starts in a YAML text: line and column from 1, the column counted in Unicode
/// scalars (as libyaml counted, so `file:line:column` in an error is where an editor shows it).
public struct YAMLMark: Sendable, Equatable, CustomStringConvertible {
    public var line: Int
    public var column: Int

    public init(line: Int, column: Int) {
        self.line = line
        self.column = column
    }

    public var description: String { "\(line):\(column)" }
}

/// One node of a YAML document as `YAMLReader` reads it: a scalar, a mapping or a sequence,
/// each with the mark of where it starts. A plain value: made by the reader, then only read,
/// by whichever thread loads the configuration.
///
/// Nothing is resolved: every scalar is the text it is (`NodeReader` parses its own numbers,
/// sizes and booleans, and names the node when it cannot), with its style so that a reader
/// can tell `null` from `"null"`. An alias is the node its anchor names (marks included);
/// there are no tags (`YAMLReader` refuses them).
public enum YAMLNode: Sendable, Equatable {
    case scalar(Scalar)
    case mapping(Mapping)
    case sequence(Sequence)

    /// A scalar's text and how it was written.
    public struct Scalar: Sendable, Equatable {
        /// How the scalar was written: only a plain one can stand for null, a boolean or a number.
        public enum Style: Sendable, Equatable {
            case plain, singleQuoted, doubleQuoted, literal, folded
        }

        /// The value, escapes and folding applied; "" for an empty value (a key with nothing after it).
        public var string: String
        public var style: Style
        public var mark: YAMLMark

        public init(_ string: String, style: Style = .plain, mark: YAMLMark = YAMLMark(line: 0, column: 0)) {
            self.string = string
            self.style = style
            self.mark = mark
        }
    }

    /// A mapping's entries in the order written (keys are unique: the reader refuses a
    /// duplicate).
    public struct Mapping: RandomAccessCollection, Sendable, Equatable {
        public typealias Element = (key: YAMLNode, value: YAMLNode)
        var entries: [Element]
        public var mark: YAMLMark

        public var startIndex: Int { entries.startIndex }
        public var endIndex: Int { entries.endIndex }
        public subscript(position: Int) -> Element { entries[position] }

        /// The value of the scalar key `key`, if there is one.
        public subscript(key: String) -> YAMLNode? {
            entries.first { $0.key.scalar?.string == key }?.value
        }

        public static func == (a: Mapping, b: Mapping) -> Bool {
            a.mark == b.mark && a.entries.count == b.entries.count
                && zip(a.entries, b.entries).allSatisfy { $0.key == $1.key && $0.value == $1.value }
        }
    }

    /// A sequence's items in order.
    public struct Sequence: RandomAccessCollection, Sendable, Equatable {
        var items: [YAMLNode]
        public var mark: YAMLMark

        public var startIndex: Int { items.startIndex }
        public var endIndex: Int { items.endIndex }
        public subscript(position: Int) -> YAMLNode { items[position] }
    }

    /// The scalar, if this node is one.
    public var scalar: Scalar? {
        if case .scalar(let s) = self { return s }
        return nil
    }

    public var mark: YAMLMark {
        switch self {
        case .scalar(let s): return s.mark
        case .mapping(let m): return m.mark
        case .sequence(let s): return s.mark
        }
    }

    /// The value of `key` if this node is a mapping that has it.
    public subscript(key: String) -> YAMLNode? {
        if case .mapping(let m) = self { return m[key] }
        return nil
    }
}

extension YAMLNode.Scalar {
    /// The boolean a plain scalar spells (`true`, `yes`, `on`, `false`, `no`, `off`, in any
    /// case: YAML 1.1's words, which `ctx.config` has always read), else nil.
    public var bool: Bool? {
        guard style == .plain else { return nil }
        switch string.lowercased() {
        case "true", "yes", "on": return true
        case "false", "no", "off": return false
        default: return nil
        }
    }

    /// The integer a plain scalar spells: decimal, `0x` hexadecimal, `0o` or leading-`0`
    /// octal, `0b` binary, with an optional sign and `_` separators; else nil.
    public var int: Int? {
        guard style == .plain else { return nil }
        let text = string.filter { $0 != "_" }
        if text == "0" { return 0 }
        let negative = text.hasPrefix("-")
        let digits = text.dropFirst(negative || text.hasPrefix("+") ? 1 : 0)
        let sign = negative ? "-" : ""
        for (prefix, radix) in [("0x", 16), ("0b", 2), ("0o", 8), ("0", 8)] where digits.hasPrefix(prefix) {
            return Int(sign + digits.dropFirst(prefix.count), radix: radix)
        }
        return Int(text)
    }

    /// The number a plain scalar spells (what `Double` reads, `_` separators allowed, and
    /// YAML's `.inf`, `-.inf`, `.nan`); else nil.
    public var float: Double? {
        guard style == .plain else { return nil }
        switch string.lowercased() {
        case ".inf", "+.inf": return .infinity
        case "-.inf": return -.infinity
        case ".nan": return .nan
        default: return Double(string.filter { $0 != "_" })
        }
    }
}

/// Why a YAML text could not be read, and where.
public struct YAMLError: Error, Sendable, Equatable, CustomStringConvertible {
    public var mark: YAMLMark
    public var problem: String

    public var description: String { "\(mark): \(problem)" }
}

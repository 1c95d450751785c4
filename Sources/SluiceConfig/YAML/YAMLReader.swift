/// Reads the YAML that Sluice's configuration files are written in into a `YAMLNode` tree.
///
/// One document of block mappings and sequences (a sequence may sit at its key's indentation,
/// an item may open a mapping on its own line: `- key: value`), flow mappings and sequences
/// (`{ a: b, c: [d] }`, JSON included), plain, single- and double-quoted scalars (every YAML
/// escape), literal `|` and folded `>` block scalars with their indentation and chomping
/// indicators, comments, anchors and aliases (`&name`, `*name`: PyYAML writes them for a value
/// that appears twice), and `---` / `...` around the document. An empty value is an empty
/// plain scalar. Refused, each with the line and column where it starts: tags, directives,
/// complex (`?`) keys, a second document, duplicate keys, tabs used as indentation, control
/// characters, and nesting deeper than `maxDepth`.
///
/// A value used by one thread at a time (`read` makes one per text). The reader works on the
/// text's UTF-8 bytes; a node's mark is computed from its byte offset with a table of line
/// starts.
public struct YAMLReader {
    /// Collections nested deeper than this are an error rather than a deep recursion (libyaml's
    /// limit, which Sluice's readers were written against).
    public static let maxDepth = 1000

    /// The document's root, or nil for a text with no document (empty, or only comments):
    /// a configuration of defaults.
    public static func read(_ text: String) throws(YAMLError) -> YAMLNode? {
        var reader = YAMLReader(text)
        return try reader.readStream()
    }

    private let bytes: [UInt8]
    /// The byte offset at which each line starts.
    private var lineStarts: [Int] = [0]
    private var i = 0
    private var depth = 0
    /// The nodes named so far by `&name`, for `*name`.
    private var anchors: [String: YAMLNode] = [:]

    private init(_ text: String) {
        bytes = Array(text.utf8)
    }

    // MARK: stream

    private mutating func readStream() throws(YAMLError) -> YAMLNode? {
        try checkCharacters()
        if bytes.starts(with: [0xEF, 0xBB, 0xBF]) {
            // A byte order mark: the first line starts after it.
            i = 3
            lineStarts[0] = 3
        }
        try skipToContent()
        if at(0) == UInt8(ascii: "%") { throw error("directives (%) are not supported") }
        if isDocumentMarker("---") {
            i += 3
            try skipToContent()
        }
        var root: YAMLNode?
        if i < bytes.count, !isDocumentMarker("---"), !isDocumentMarker("...") {
            root = try readBlockNode(parentIndent: -1, collections: true)
            try skipToContent()
        }
        if isDocumentMarker("...") {
            i += 3
            try skipToContent()
        }
        if isDocumentMarker("---") {
            let start = i
            i += 3
            try skipToContent()
            if i < bytes.count {
                i = start
                throw error("a configuration is one YAML document; a second starts here")
            }
        }
        if i < bytes.count { throw error("unexpected content: the document ended on an earlier line") }
        return root
    }

    /// libyaml's reader refused what is not printable; so does this one, before anything else.
    private mutating func checkCharacters() throws(YAMLError) {
        var offset = 0
        for scalar in String(decoding: bytes, as: UTF8.self).unicodeScalars {
            let v = scalar.value
            let printable =
                v == 0x09 || v == 0x0A || v == 0x0D || (0x20...0x7E).contains(v) || v == 0x85
                || (0xA0...0xD7FF).contains(v) || (0xE000...0xFFFD).contains(v) || v >= 0x10000
                || (v == 0xFEFF && offset == 0)
            if !printable {
                i = offset
                throw error("control characters are not allowed")
            }
            if v == 0x0A || (v == 0x0D && offset + 1 < bytes.count && bytes[offset + 1] != 0x0A) {
                lineStarts.append(offset + 1)
            }
            offset += UTF8.width(scalar)
        }
    }

    // MARK: block context

    /// A node in the block context, starting at the current byte (content, not a space).
    /// `parentIndent`: the column of the enclosing collection (-1 at the top), which a plain
    /// scalar's further lines and a block scalar's lines must be indented past.
    /// `collections`: whether a block mapping or sequence may start here (not after `key:` on
    /// the same line). A scalar or flow collection leaves the reader at the end of its line.
    private mutating func readBlockNode(parentIndent: Int, collections: Bool) throws(YAMLError) -> YAMLNode {
        depth += 1
        defer { depth -= 1 }
        guard depth <= Self.maxDepth else { throw error("nesting deeper than \(Self.maxDepth) levels") }
        let column = self.column(of: i)
        let b = at(0)
        if b == UInt8(ascii: "-"), isBlankOrEnd(at(1)) {
            guard collections else { throw error("a block sequence cannot start on its key's line") }
            return try readBlockSequence(indent: column)
        }
        if b == UInt8(ascii: "|") || b == UInt8(ascii: ">") {
            return try readBlockScalar(parentIndent: parentIndent)
        }
        if b == UInt8(ascii: "&") {
            let name = try anchorName()
            let mark = self.mark(at: i)
            try skipBlanks()
            var node: YAMLNode
            if isLineEnd(at(0)) {
                // `key: &name` with the value on the lines below (a sequence may sit at the
                // key's indentation, as PyYAML writes it, when this is a mapping's value).
                try skipToContent()
                let next = self.column(of: i)
                let sequenceHere = !collections && next == parentIndent && at(0) == UInt8(ascii: "-") && isBlankOrEnd(at(1))
                if i < bytes.count, !isDocumentMarker("---"), !isDocumentMarker("..."), next > parentIndent || sequenceHere {
                    node =
                        try sequenceHere
                        ? readBlockSequence(indent: next) : readBlockNode(parentIndent: parentIndent, collections: true)
                } else {
                    // Nothing below: an empty value (the caller goes on from the next content).
                    node = .scalar(YAMLNode.Scalar("", mark: mark))
                }
            } else {
                node = try readBlockNode(parentIndent: parentIndent, collections: collections)
            }
            anchors[name] = node
            return node
        }
        if b == UInt8(ascii: "*") {
            let node = try alias()
            try expectLineEnd()
            return node
        }
        try refuseUnsupported()
        if b == UInt8(ascii: "[") || b == UInt8(ascii: "{") {
            let node = try readFlowCollection()
            try skipBlanks()
            if at(0) == UInt8(ascii: ":") { throw error("a mapping key must be a scalar") }
            try expectLineEnd()
            return node
        }
        let start = i
        if try startsMappingKey() {
            guard collections else { throw error("a mapping cannot start on its key's line (quote the value if it holds ': ')") }
            i = start
            return try readBlockMapping(indent: column)
        }
        i = start
        let node =
            try b == UInt8(ascii: "\"") || b == UInt8(ascii: "'")
            ? readQuoted() : readPlain(parentIndent: parentIndent, flow: false)
        try expectLineEnd()
        return node
    }

    /// Whether the scalar at the current byte is followed by `:` and a space on its line.
    private mutating func startsMappingKey() throws(YAMLError) -> Bool {
        let b = at(0)
        if b == UInt8(ascii: "\"") || b == UInt8(ascii: "'") {
            _ = try readQuoted()
        } else {
            try checkPlainStart(flow: false)
            _ = scanPlainLine(flow: false)
        }
        try skipBlanks()
        return at(0) == UInt8(ascii: ":") && isBlankOrEnd(at(1))
    }

    private mutating func readBlockMapping(indent: Int) throws(YAMLError) -> YAMLNode {
        let mark = self.mark(at: i)
        var entries: [YAMLNode.Mapping.Element] = []
        var seen: [String: YAMLMark] = [:]
        while true {
            try refuseUnsupported()
            if at(0) == UInt8(ascii: "-"), isBlankOrEnd(at(1)) { throw error("expected a key, found a sequence item") }
            if at(0) == UInt8(ascii: "[") || at(0) == UInt8(ascii: "{") { throw error("a mapping key must be a scalar") }
            let keyStart = i
            let key: YAMLNode
            if at(0) == UInt8(ascii: "\"") || at(0) == UInt8(ascii: "'") {
                key = try readQuoted()
            } else {
                try checkPlainStart(flow: false)
                let end = scanPlainLine(flow: false)
                key = .scalar(YAMLNode.Scalar(text(keyStart, end), mark: self.mark(at: keyStart)))
            }
            try skipBlanks()
            guard at(0) == UInt8(ascii: ":"), isBlankOrEnd(at(1)) else {
                throw error("expected ':' after the key")
            }
            try remember(key, in: &seen)
            i += 1
            let afterColon = i
            try skipBlanks()
            let value: YAMLNode
            if isLineEnd(at(0)) {
                try skipToContent()
                let next = column(of: i)
                if i < bytes.count, !isDocumentMarker("---"), !isDocumentMarker("..."),
                    next > indent || (next == indent && at(0) == UInt8(ascii: "-") && isBlankOrEnd(at(1)))
                {
                    value =
                        try next > indent
                        ? readBlockNode(parentIndent: indent, collections: true) : readBlockSequence(indent: indent)
                } else {
                    value = .scalar(YAMLNode.Scalar("", mark: self.mark(at: afterColon)))
                }
            } else {
                value = try readBlockNode(parentIndent: indent, collections: false)
            }
            entries.append((key, value))
            try skipToContent()
            if i >= bytes.count || isDocumentMarker("---") || isDocumentMarker("...") { break }
            let next = column(of: i)
            if next < indent { break }
            if next > indent { throw error("this line is indented past the keys of its mapping") }
        }
        return .mapping(YAMLNode.Mapping(entries: entries, mark: mark))
    }

    private mutating func readBlockSequence(indent: Int) throws(YAMLError) -> YAMLNode {
        let mark = self.mark(at: i)
        var items: [YAMLNode] = []
        while true {
            i += 1
            let afterDash = i
            try skipBlanks()
            if isLineEnd(at(0)) {
                try skipToContent()
                if i < bytes.count, !isDocumentMarker("---"), !isDocumentMarker("..."), column(of: i) > indent {
                    items.append(try readBlockNode(parentIndent: indent, collections: true))
                } else {
                    items.append(.scalar(YAMLNode.Scalar("", mark: self.mark(at: afterDash))))
                }
            } else {
                items.append(try readBlockNode(parentIndent: indent, collections: true))
            }
            try skipToContent()
            if i >= bytes.count || isDocumentMarker("---") || isDocumentMarker("...") { break }
            let next = column(of: i)
            if next < indent { break }
            if next > indent { throw error("this line is indented past the items of its sequence") }
            guard at(0) == UInt8(ascii: "-"), isBlankOrEnd(at(1)) else { break }
        }
        return .sequence(YAMLNode.Sequence(items: items, mark: mark))
    }

    /// `|` or `>`, its indicators, and the lines indented past `parentIndent` that follow.
    private mutating func readBlockScalar(parentIndent: Int) throws(YAMLError) -> YAMLNode {
        let mark = self.mark(at: i)
        let literal = at(0) == UInt8(ascii: "|")
        i += 1
        var increment: Int?
        var chomp = 0  // -1 strip, 0 clip, +1 keep
        for _ in 0..<2 {
            let b = at(0)
            if b == UInt8(ascii: "+") || b == UInt8(ascii: "-") {
                chomp = b == UInt8(ascii: "+") ? 1 : -1
                i += 1
            } else if b >= UInt8(ascii: "0"), b <= UInt8(ascii: "9"), increment == nil {
                if b == UInt8(ascii: "0") { throw error("a block scalar's indentation indicator is from 1 to 9") }
                increment = Int(b - UInt8(ascii: "0"))
                i += 1
            }
        }
        let afterHeader = i
        try skipBlanks()
        if at(0) == UInt8(ascii: "#"), i > afterHeader { skipComment() }
        guard at(0) == 0x0A || at(0) == 0x0D || i >= bytes.count else {
            throw error("expected a comment or the end of the line after the block scalar's indicator")
        }
        skipBreak()
        // The lines: each either empty (only spaces, fewer than the indentation) or content.
        var indent = increment.map { max(parentIndent, 0) + $0 } ?? 0
        if increment == nil {
            var p = i
            var widest = 0
            while p < bytes.count {
                var q = p
                while q < bytes.count, bytes[q] == UInt8(ascii: " ") { q += 1 }
                widest = max(widest, q - p)
                guard q < bytes.count, bytes[q] == 0x0A || bytes[q] == 0x0D else { break }
                p = q + (bytes[q] == 0x0D && q + 1 < bytes.count && bytes[q + 1] == 0x0A ? 2 : 1)
            }
            indent = max(widest, parentIndent + 1, 1)
        }
        var out: [UInt8] = []
        var leadingBreak = false
        var leadingBlank = false
        var trailingBreaks = 0
        var sawContent = false
        while i < bytes.count {
            let lineStart = i
            var q = i
            while q < bytes.count, q - lineStart < indent, bytes[q] == UInt8(ascii: " ") { q += 1 }
            if q >= bytes.count {
                i = q
                break
            }
            if bytes[q] == 0x0A || bytes[q] == 0x0D {
                trailingBreaks += 1
                i = q
                skipBreak()
                continue
            }
            guard q - lineStart == indent else {
                i = lineStart
                break
            }
            if isDocumentMarker("---", at: lineStart) || isDocumentMarker("...", at: lineStart) {
                i = lineStart
                break
            }
            let blank = bytes[q] == UInt8(ascii: " ") || bytes[q] == UInt8(ascii: "\t")
            if !literal, leadingBreak, !leadingBlank, !blank {
                if trailingBreaks == 0 { out.append(UInt8(ascii: " ")) }
            } else if leadingBreak {
                out.append(0x0A)
            }
            out.append(contentsOf: repeatElement(0x0A, count: trailingBreaks))
            trailingBreaks = 0
            leadingBlank = blank
            var end = q
            while end < bytes.count, bytes[end] != 0x0A, bytes[end] != 0x0D { end += 1 }
            out.append(contentsOf: bytes[q..<end])
            sawContent = true
            i = end
            leadingBreak = i < bytes.count
            skipBreak()
        }
        if chomp >= 0, leadingBreak { out.append(0x0A) }
        if chomp == 1 { out.append(contentsOf: repeatElement(0x0A, count: trailingBreaks)) }
        if !sawContent, chomp < 1 { out.removeAll() }
        // The reader stands at the start of the next line (or the end); step back onto the
        // last consumed line break so that the caller's line-end check holds.
        if i > 0, i <= bytes.count, bytes[i - 1] == 0x0A || bytes[i - 1] == 0x0D {
            i -= bytes[i - 1] == 0x0A && i >= 2 && bytes[i - 2] == 0x0D ? 2 : 1
        }
        return .scalar(YAMLNode.Scalar(String(decoding: out, as: UTF8.self), style: literal ? .literal : .folded, mark: mark))
    }

    // MARK: flow context

    private mutating func readFlowCollection() throws(YAMLError) -> YAMLNode {
        depth += 1
        defer { depth -= 1 }
        guard depth <= Self.maxDepth else { throw error("nesting deeper than \(Self.maxDepth) levels") }
        let open = i
        let isMapping = at(0) == UInt8(ascii: "{")
        let close = isMapping ? UInt8(ascii: "}") : UInt8(ascii: "]")
        i += 1
        var entries: [YAMLNode.Mapping.Element] = []
        var items: [YAMLNode] = []
        var seen: [String: YAMLMark] = [:]
        while true {
            try skipFlowSpace(open: open)
            if at(0) == close {
                i += 1
                break
            }
            let first = try readFlowNode(open: open)
            try skipFlowSpace(open: open)
            var value: YAMLNode?
            if at(0) == UInt8(ascii: ":") {
                guard first.scalar != nil else { throw error("a mapping key must be a scalar") }
                i += 1
                let afterColon = i
                try skipFlowSpace(open: open)
                value =
                    try at(0) == UInt8(ascii: ",") || at(0) == close
                    ? .scalar(YAMLNode.Scalar("", mark: mark(at: afterColon))) : readFlowNode(open: open)
                try skipFlowSpace(open: open)
            }
            if isMapping {
                guard first.scalar != nil else { throw error("a mapping key must be a scalar", at: first.mark) }
                try remember(first, in: &seen)
                entries.append((first, value ?? .scalar(YAMLNode.Scalar("", mark: mark(at: i)))))
            } else if let value {
                items.append(.mapping(YAMLNode.Mapping(entries: [(first, value)], mark: first.mark)))
            } else {
                items.append(first)
            }
            if at(0) == UInt8(ascii: ",") {
                i += 1
            } else if at(0) != close {
                throw error("expected ',' or '\(Character(Unicode.Scalar(close)))'")
            }
        }
        let mark = self.mark(at: open)
        return isMapping
            ? .mapping(YAMLNode.Mapping(entries: entries, mark: mark)) : .sequence(YAMLNode.Sequence(items: items, mark: mark))
    }

    private mutating func readFlowNode(open: Int) throws(YAMLError) -> YAMLNode {
        let b = at(0)
        if b == UInt8(ascii: "[") || b == UInt8(ascii: "{") { return try readFlowCollection() }
        if b == UInt8(ascii: "\"") || b == UInt8(ascii: "'") { return try readQuoted() }
        if b == UInt8(ascii: ",") || b == UInt8(ascii: "]") || b == UInt8(ascii: "}") {
            throw error("expected a value")
        }
        if b == UInt8(ascii: "|") || b == UInt8(ascii: ">") { throw error("a block scalar cannot be inside a flow collection") }
        if b == UInt8(ascii: "-"), isBlankOrEnd(at(1)) { throw error("a block sequence cannot be inside a flow collection") }
        if b == UInt8(ascii: "&") {
            let name = try anchorName()
            try skipFlowSpace(open: open)
            let node = try readFlowNode(open: open)
            anchors[name] = node
            return node
        }
        if b == UInt8(ascii: "*") { return try alias() }
        try refuseUnsupported()
        return try readPlain(parentIndent: -1, flow: true)
    }

    /// Spaces, tabs, line breaks and comments between a flow collection's entries.
    private mutating func skipFlowSpace(open: Int) throws(YAMLError) {
        while i < bytes.count {
            switch bytes[i] {
            case UInt8(ascii: " "), UInt8(ascii: "\t"), 0x0A, 0x0D: i += 1
            case UInt8(ascii: "#"): skipComment()
            default:
                if isDocumentMarker("---") || isDocumentMarker("...") {
                    throw error("a flow collection is not closed before the document marker")
                }
                return
            }
        }
        throw error("a flow collection is not closed", at: mark(at: open))
    }

    // MARK: scalars

    /// A plain scalar: its first line, then, folded, the lines indented past `parentIndent`
    /// (any line, in a flow collection) up to a comment, a `: ` or, in a flow collection, an
    /// indicator.
    private mutating func readPlain(parentIndent: Int, flow: Bool) throws(YAMLError) -> YAMLNode {
        let start = i
        try checkPlainStart(flow: flow)
        var out = Array(bytes[start..<scanPlainLine(flow: flow)])
        while true {
            let end = i
            try skipBlanks()
            guard isLineEnd(at(0)), at(0) != UInt8(ascii: "#") else {
                i = end
                break
            }
            var breaks = 0
            while isLineEnd(at(0)), at(0) != UInt8(ascii: "#"), i < bytes.count {
                skipBreak()
                breaks += 1
                while at(0) == UInt8(ascii: " ") || (flow && at(0) == UInt8(ascii: "\t")) { i += 1 }
                if at(0) == UInt8(ascii: "\t") {
                    var q = i
                    while q < bytes.count, bytes[q] == UInt8(ascii: " ") || bytes[q] == UInt8(ascii: "\t") { q += 1 }
                    if q < bytes.count, !isLineEnd(bytes[q]) { throw error("a tab cannot indent a line") }
                    i = q
                }
            }
            let b = at(0)
            let stops =
                i >= bytes.count || b == UInt8(ascii: "#") || column(of: i) <= parentIndent && !flow
                || isDocumentMarker("---") || isDocumentMarker("...")
                || (flow && (isFlowIndicator(b) || (b == UInt8(ascii: ":") && (isBlankOrEnd(at(1)) || isFlowIndicator(at(1))))))
            if stops {
                i = end
                break
            }
            if breaks == 1 {
                out.append(UInt8(ascii: " "))
            } else {
                out.append(contentsOf: repeatElement(0x0A, count: breaks - 1))
            }
            let lineStart = i
            let lineEnd = scanPlainLine(flow: flow)
            out.append(contentsOf: bytes[lineStart..<lineEnd])
            if !flow, at(0) == UInt8(ascii: ":") {
                throw error("a mapping cannot start inside a plain value (quote the value if it holds ': ')")
            }
        }
        return .scalar(YAMLNode.Scalar(String(decoding: out, as: UTF8.self), mark: mark(at: start)))
    }

    /// Moves past one line of a plain scalar; answers where its text ends (trailing spaces
    /// left out) and leaves the reader there.
    private mutating func scanPlainLine(flow: Bool) -> Int {
        var end = i
        while i < bytes.count {
            let b = bytes[i]
            if b == 0x0A || b == 0x0D { break }
            if b == UInt8(ascii: ":"), isBlankOrEnd(at(1)) || (flow && isFlowIndicator(at(1))) { break }
            if flow, isFlowIndicator(b) { break }
            if b == UInt8(ascii: " ") || b == UInt8(ascii: "\t") {
                if at(1) == UInt8(ascii: "#") { break }
            } else {
                end = i + 1
            }
            i += 1
        }
        i = end
        return end
    }

    private func checkPlainStart(flow: Bool) throws(YAMLError) {
        let b = at(0)
        let next = at(1)
        switch b {
        case UInt8(ascii: "-"), UInt8(ascii: "?"), UInt8(ascii: ":"):
            if isBlankOrEnd(next) || (flow && isFlowIndicator(next)) {
                throw error("expected a value, found '\(Character(Unicode.Scalar(b)))'")
            }
        case UInt8(ascii: ","), UInt8(ascii: "["), UInt8(ascii: "]"), UInt8(ascii: "{"), UInt8(ascii: "}"), UInt8(ascii: "#"),
            UInt8(ascii: "|"), UInt8(ascii: ">"), UInt8(ascii: "%"), UInt8(ascii: "@"), UInt8(ascii: "`"):
            throw error("'\(Character(Unicode.Scalar(b)))' cannot start a plain value (quote the value)")
        default:
            if isLineEnd(b) || b == 0 { throw error("expected a value") }
        }
    }

    /// A single- or double-quoted scalar; its line breaks fold as a plain scalar's do.
    private mutating func readQuoted() throws(YAMLError) -> YAMLNode {
        let start = i
        let quote = bytes[i]
        let double = quote == UInt8(ascii: "\"")
        i += 1
        var out: [UInt8] = []
        /// Where in `out` the spaces just written (which a line break drops) begin.
        var spacesFrom: Int?
        while true {
            guard i < bytes.count else { throw error("a quoted value is not closed", at: mark(at: start)) }
            let b = bytes[i]
            if b == quote {
                if !double, at(1) == quote {
                    out.append(quote)
                    spacesFrom = nil
                    i += 2
                    continue
                }
                i += 1
                break
            }
            if b == 0x0A || b == 0x0D {
                if let spacesFrom { out.removeSubrange(spacesFrom...) }
                spacesFrom = nil
                var breaks = 0
                while i < bytes.count,
                    bytes[i] == 0x0A || bytes[i] == 0x0D || bytes[i] == UInt8(ascii: " ") || bytes[i] == UInt8(ascii: "\t")
                {
                    if bytes[i] == 0x0A || bytes[i] == 0x0D {
                        skipBreak()
                        breaks += 1
                        if isDocumentMarker("---") || isDocumentMarker("...") {
                            throw error("a quoted value is not closed", at: mark(at: start))
                        }
                    } else {
                        i += 1
                    }
                }
                if breaks == 1 {
                    out.append(UInt8(ascii: " "))
                } else {
                    out.append(contentsOf: repeatElement(0x0A, count: breaks - 1))
                }
                continue
            }
            if double, b == UInt8(ascii: "\\") {
                try readEscape(into: &out)
                spacesFrom = nil
                continue
            }
            if b == UInt8(ascii: " ") || b == UInt8(ascii: "\t") {
                if spacesFrom == nil { spacesFrom = out.count }
            } else {
                spacesFrom = nil
            }
            out.append(b)
            i += 1
        }
        return .scalar(
            YAMLNode.Scalar(
                String(decoding: out, as: UTF8.self), style: double ? .doubleQuoted : .singleQuoted, mark: mark(at: start)))
    }

    /// One `\` escape of a double-quoted scalar, the reader at the backslash.
    private mutating func readEscape(into out: inout [UInt8]) throws(YAMLError) {
        let e = at(1)
        let simple: [UInt8: UInt32] = [
            UInt8(ascii: "0"): 0, UInt8(ascii: "a"): 7, UInt8(ascii: "b"): 8, UInt8(ascii: "t"): 9, 0x09: 9,
            UInt8(ascii: "n"): 10, UInt8(ascii: "v"): 11, UInt8(ascii: "f"): 12, UInt8(ascii: "r"): 13, UInt8(ascii: "e"): 27,
            UInt8(ascii: " "): 32, UInt8(ascii: "\""): 34, UInt8(ascii: "/"): 47, UInt8(ascii: "\\"): 92,
            UInt8(ascii: "N"): 0x85, UInt8(ascii: "_"): 0xA0, UInt8(ascii: "L"): 0x2028, UInt8(ascii: "P"): 0x2029,
        ]
        var value: UInt32
        if let v = simple[e] {
            value = v
            i += 2
        } else if e == 0x0A || e == 0x0D {
            // An escaped line break: the lines join with nothing between them.
            i += 1
            skipBreak()
            while at(0) == UInt8(ascii: " ") || at(0) == UInt8(ascii: "\t") { i += 1 }
            return
        } else if let width = [UInt8(ascii: "x"): 2, UInt8(ascii: "u"): 4, UInt8(ascii: "U"): 8][e] {
            guard i + 2 + width <= bytes.count,
                let v = UInt32(String(decoding: bytes[(i + 2)..<(i + 2 + width)], as: UTF8.self), radix: 16)
            else { throw error("expected \(width) hexadecimal digits after '\\\(Character(Unicode.Scalar(e)))'") }
            value = v
            i += 2 + width
        } else {
            throw error("unknown escape '\\\(Character(Unicode.Scalar(e)))'")
        }
        guard let scalar = Unicode.Scalar(value) else { throw error("the escape names no Unicode character") }
        out.append(contentsOf: String(Character(scalar)).utf8)
    }

    // MARK: bytes, lines and marks

    private func at(_ k: Int) -> UInt8 { i + k < bytes.count ? bytes[i + k] : 0 }

    private func isBlankOrEnd(_ b: UInt8) -> Bool {
        b == UInt8(ascii: " ") || b == UInt8(ascii: "\t") || b == 0x0A || b == 0x0D || b == 0
    }

    /// A line break, the end of the text, or a comment: nothing more on this line.
    private func isLineEnd(_ b: UInt8) -> Bool { b == 0x0A || b == 0x0D || b == 0 || b == UInt8(ascii: "#") }

    private func isFlowIndicator(_ b: UInt8) -> Bool {
        b == UInt8(ascii: ",") || b == UInt8(ascii: "[") || b == UInt8(ascii: "]") || b == UInt8(ascii: "{")
            || b == UInt8(ascii: "}")
    }

    private func isDocumentMarker(_ marker: StaticString, at p: Int? = nil) -> Bool {
        let p = p ?? i
        guard p + 3 <= bytes.count, column(of: p) == 0 else { return false }
        let m = marker.utf8Start
        guard bytes[p] == m[0], bytes[p + 1] == m[1], bytes[p + 2] == m[2] else { return false }
        return p + 3 == bytes.count || isBlankOrEnd(bytes[p + 3])
    }

    private mutating func skipBreak() {
        if at(0) == 0x0D { i += 1 }
        if at(0) == 0x0A { i += 1 }
    }

    private mutating func skipComment() {
        while i < bytes.count, bytes[i] != 0x0A, bytes[i] != 0x0D { i += 1 }
    }

    /// Spaces and tabs on the current line.
    private mutating func skipBlanks() throws(YAMLError) {
        while at(0) == UInt8(ascii: " ") || at(0) == UInt8(ascii: "\t") { i += 1 }
    }

    /// Spaces, comments and line breaks up to the next content (or the end). A tab may separate
    /// within a line but not indent one.
    private mutating func skipToContent() throws(YAMLError) {
        var lineStart = column(of: i) == 0
        while i < bytes.count {
            var tab: Int?
            while at(0) == UInt8(ascii: " ") || at(0) == UInt8(ascii: "\t") {
                if at(0) == UInt8(ascii: "\t"), lineStart, tab == nil { tab = i }
                i += 1
            }
            if at(0) == UInt8(ascii: "#") { skipComment() }
            if at(0) == 0x0A || at(0) == 0x0D {
                skipBreak()
                lineStart = true
                continue
            }
            if let tab, i < bytes.count {
                i = tab
                throw error("a tab cannot indent a line (use spaces)")
            }
            return
        }
    }

    /// After a scalar or flow collection: only spaces and a comment may follow on its line.
    private mutating func expectLineEnd() throws(YAMLError) {
        try skipBlanks()
        if at(0) == UInt8(ascii: "#"), i > 0, bytes[i - 1] == UInt8(ascii: " ") || bytes[i - 1] == UInt8(ascii: "\t") {
            skipComment()
        }
        guard at(0) == 0x0A || at(0) == 0x0D || i >= bytes.count else {
            if at(0) == UInt8(ascii: ":") {
                throw error("a mapping cannot start on its key's line (quote the value if it holds ': ')")
            }
            throw error("unexpected '\(String(decoding: bytes[i..<min(i + 1, bytes.count)], as: UTF8.self))' after the value")
        }
    }

    /// `&name`: the reader moves past it.
    private mutating func anchorName() throws(YAMLError) -> String {
        let start = i + 1
        i = start
        while i < bytes.count, !isBlankOrEnd(bytes[i]), !isFlowIndicator(bytes[i]) { i += 1 }
        guard i > start else { throw error("an anchor needs a name", at: mark(at: start - 1)) }
        return text(start, i)
    }

    /// `*name`: the node anchored as `&name` earlier in the document (PyYAML writes these for
    /// a value that appears twice).
    private mutating func alias() throws(YAMLError) -> YAMLNode {
        let at = i
        let name = try anchorName()
        guard let node = anchors[name] else { throw error("unknown alias '*\(name)'", at: mark(at: at)) }
        return node
    }

    /// Tags, complex keys, and anchors or aliases as keys: Sluice's configurations use none.
    private func refuseUnsupported() throws(YAMLError) {
        switch at(0) {
        case UInt8(ascii: "&"), UInt8(ascii: "*"): throw error("an anchor or alias cannot be a key")
        case UInt8(ascii: "!"): throw error("tags (!) are not supported")
        case UInt8(ascii: "?") where isBlankOrEnd(at(1)): throw error("complex keys (?) are not supported")
        default: return
        }
    }

    private func remember(_ key: YAMLNode, in seen: inout [String: YAMLMark]) throws(YAMLError) {
        guard let name = key.scalar?.string else { return }
        if let first = seen[name] {
            throw error("duplicate key '\(name)' (first at line \(first.line))", at: key.mark)
        }
        seen[name] = key.mark
    }

    private func text(_ start: Int, _ end: Int) -> String { String(decoding: bytes[start..<end], as: UTF8.self) }

    /// The column from 0 in bytes (indentation is spaces, so a column compared with another is
    /// one in bytes).
    private func column(of offset: Int) -> Int { offset - lineStarts[line(of: offset)] }

    /// The line from 0.
    private func line(of offset: Int) -> Int {
        var low = 0
        var high = lineStarts.count - 1
        while low < high {
            let mid = (low + high + 1) / 2
            if lineStarts[mid] <= offset { low = mid } else { high = mid - 1 }
        }
        return low
    }

    private func mark(at offset: Int) -> YAMLMark {
        let line = line(of: offset)
        var column = 1
        for k in lineStarts[line]..<min(offset, bytes.count) where bytes[k] & 0xC0 != 0x80 { column += 1 }
        return YAMLMark(line: line + 1, column: column)
    }

    private func error(_ problem: String, at mark: YAMLMark? = nil) -> YAMLError {
        YAMLError(mark: mark ?? self.mark(at: i), problem: problem)
    }
}

import SluiceCore
import Testing

@testable import SluiceConfig

#if canImport(Glibc)
    import Glibc
#endif

/// `YAMLReader`: every construct Sluice's configurations are written with, the marks errors
/// are located by, what it refuses (each at its line and column), and random inputs, which
/// must give a tree or a located error, never a crash.
@Suite struct YAMLReaderTests {
    /// The tree as plain values, to compare: a scalar's text, an array, or key/value pairs.
    indirect enum Plain: Equatable, CustomStringConvertible {
        case s(String)
        case a([Plain])
        case m([(String, Plain)])

        static func == (x: Plain, y: Plain) -> Bool {
            switch (x, y) {
            case (.s(let a), .s(let b)): return a == b
            case (.a(let a), .a(let b)): return a == b
            case (.m(let a), .m(let b)): return a.count == b.count && zip(a, b).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
            default: return false
            }
        }

        var description: String {
            switch self {
            case .s(let s): return "\"\(s)\""
            case .a(let items): return "[" + items.map(\.description).joined(separator: ", ") + "]"
            case .m(let pairs): return "{" + pairs.map { "\($0.0): \($0.1)" }.joined(separator: ", ") + "}"
            }
        }

        init(_ node: YAMLNode) {
            switch node {
            case .scalar(let s): self = .s(s.string)
            case .sequence(let items): self = .a(items.map(Plain.init))
            case .mapping(let m): self = .m(m.map { ($0.key.scalar?.string ?? "?", Plain($0.value)) })
            }
        }
    }

    static func plain(_ yaml: String) throws -> Plain? {
        try YAMLReader.read(yaml).map(Plain.init)
    }

    static func error(_ yaml: String) -> YAMLError? {
        do {
            _ = try YAMLReader.read(yaml)
            return nil
        } catch {
            return error
        }
    }

    @Test func blockMappingsAndSequences() throws {
        let yaml = """
            # a comment
            listen: 127.0.0.1:3128   # trailing comment
            workers: 2
            policies:
              default:
                adapters:
                  - headers: { set: { X-A: "1" } }
                  - bearer: ${TOKEN}
              api.test:
                retry:
                  max: 3
            list:
            - a
            - b: c
              d: e
            -
            - - x
              - y
            """
        let expected: Plain = .m([
            ("listen", .s("127.0.0.1:3128")), ("workers", .s("2")),
            (
                "policies",
                .m([
                    (
                        "default",
                        .m([
                            (
                                "adapters",
                                .a([
                                    .m([("headers", .m([("set", .m([("X-A", .s("1"))]))]))]),
                                    .m([("bearer", .s("${TOKEN}"))]),
                                ])
                            )
                        ])
                    ),
                    ("api.test", .m([("retry", .m([("max", .s("3"))]))])),
                ])
            ),
            ("list", .a([.s("a"), .m([("b", .s("c")), ("d", .s("e"))]), .s(""), .a([.s("x"), .s("y")])])),
        ])
        #expect(try Self.plain(yaml) == expected)
    }

    @Test func flowCollectionsAndJSON() throws {
        #expect(
            try Self.plain("a: {b: c, d: [e, 'f', \"g\"], h: }")
                == .m([("a", .m([("b", .s("c")), ("d", .a([.s("e"), .s("f"), .s("g")])), ("h", .s(""))]))]))
        #expect(
            try Self.plain(#"{"key": 1, "list": [1, 2.5, true, null], "o": {"x":"y"}}"#)
                == .m([
                    ("key", .s("1")), ("list", .a([.s("1"), .s("2.5"), .s("true"), .s("null")])), ("o", .m([("x", .s("y"))])),
                ]))
        #expect(try Self.plain("a: [\n  one,\n  two,   # comment\n]\n") == .m([("a", .a([.s("one"), .s("two")]))]))
        #expect(
            try Self.plain("a: [http://x.test:80/p, ::1/128, a:b]")
                == .m([("a", .a([.s("http://x.test:80/p"), .s("::1/128"), .s("a:b")]))]))
        #expect(try Self.plain("a: [k: v]") == .m([("a", .a([.m([("k", .s("v"))])]))]))
        #expect(try Self.plain("a: {}\nb: []") == .m([("a", .m([])), ("b", .a([]))]))
        #expect(try Self.plain("a: [x]   # comment\nb: {y: z} # c") == .m([("a", .a([.s("x")])), ("b", .m([("y", .s("z"))]))]))
    }

    @Test func quotedScalarsAndEscapes() throws {
        #expect(try Self.plain(#"a: 'it''s # not a comment'"#) == .m([("a", .s("it's # not a comment"))]))
        #expect(try Self.plain(#"a: "t\tn\nq\"b\\s\/x\x41u\u00e9U\U0001F600 \0""#) == .m([("a", .s("t\tn\nq\"b\\s/xAuéU😀 \0"))]))
        #expect(try Self.plain("a: \"one\n  two\n\n  three\"") == .m([("a", .s("one two\nthree"))]))
        #expect(try Self.plain("a: \"joined\\\n  here\"") == .m([("a", .s("joinedhere"))]))
        #expect(try Self.plain("'quoted key': v\n\"k2\": w") == .m([("quoted key", .s("v")), ("k2", .s("w"))]))
        let node = try #require(try YAMLReader.read("a: 'null'\nb: null\nc: \"\"\nd:"))
        #expect(node["a"]?.scalar?.style == .singleQuoted)
        #expect(node["b"]?.scalar?.style == .plain)
        #expect(node["c"]?.scalar?.style == .doubleQuoted && node["c"]?.scalar?.string == "")
        #expect(node["d"]?.scalar == YAMLNode.Scalar("", style: .plain, mark: YAMLMark(line: 4, column: 3)))
    }

    @Test func plainScalarsFoldAcrossLines() throws {
        #expect(try Self.plain("a: one\n  two\n\n  three\nb: x") == .m([("a", .s("one two\nthree")), ("b", .s("x"))]))
        #expect(try Self.plain("a: x#y z  \nb: -1") == .m([("a", .s("x#y z")), ("b", .s("-1"))]))
    }

    @Test func blockScalars() throws {
        let yaml = """
            literal: |
              line one
                indented

              after blank
            folded: >
              one
              two

              three
                kept
              four
            strip: |-
              text

            keep: |+
              text

            explicit: |2
                four spaces
            last: end
            """
        let node = try #require(try YAMLReader.read(yaml))
        #expect(node["literal"]?.scalar?.string == "line one\n  indented\n\nafter blank\n")
        #expect(node["folded"]?.scalar?.string == "one two\nthree\n  kept\nfour\n")
        #expect(node["strip"]?.scalar?.string == "text")
        #expect(node["keep"]?.scalar?.string == "text\n\n")
        #expect(node["explicit"]?.scalar?.string == "  four spaces\n")
        #expect(node["last"]?.scalar?.string == "end")
        #expect(node["literal"]?.scalar?.style == .literal && node["folded"]?.scalar?.style == .folded)
        // A PEM in a sequence item, and a block scalar at the end of the text without a line break.
        let pem =
            "keys:\n  - |\n    -----BEGIN PRIVATE KEY-----\n    MC4CAQ==\n    -----END PRIVATE KEY-----\n  - x\nsrc: |\n  return {}"
        let tree = try #require(try Self.plain(pem))
        #expect(
            tree
                == .m([
                    ("keys", .a([.s("-----BEGIN PRIVATE KEY-----\nMC4CAQ==\n-----END PRIVATE KEY-----\n"), .s("x")])),
                    ("src", .s("return {}")),
                ]))
        #expect(try Self.plain("a: |\nb: 1") == .m([("a", .s("")), ("b", .s("1"))]))
    }

    /// PyYAML's `safe_dump` anchors a value that appears twice and aliases it after.
    @Test func anchorsAndAliases() throws {
        let yaml = "a: &id001\n  k: v\nb: *id001\nc: &l\n- 1\n- 2\nd: [*l, &s x, *s]\ne: &e\nf: *e\n"
        let list: Plain = .a([.s("1"), .s("2")])
        #expect(
            try Self.plain(yaml)
                == .m([
                    ("a", .m([("k", .s("v"))])), ("b", .m([("k", .s("v"))])), ("c", list), ("d", .a([list, .s("x"), .s("x")])),
                    ("e", .s("")), ("f", .s("")),
                ]))
    }

    @Test func documentsAndEmptyTexts() throws {
        #expect(try YAMLReader.read("") == nil)
        #expect(try YAMLReader.read("# only a comment\n\n") == nil)
        #expect(try YAMLReader.read("---\n") == nil)
        #expect(try Self.plain("---\na: 1\n...\n") == .m([("a", .s("1"))]))
        #expect(try Self.plain("\u{FEFF}a: 1\r\nb: 2\r\n") == .m([("a", .s("1")), ("b", .s("2"))]))
        #expect(Self.error("a: 1\n---\nb: 2\n")?.mark == YAMLMark(line: 2, column: 1))
    }

    @Test func marksAreLineAndColumnFromOne() throws {
        let node = try #require(try YAMLReader.read("top:\n  é: [x, {k: v}]\n  seq:\n    - item\n"))
        let inner = try #require(node["top"])
        #expect(node.mark == YAMLMark(line: 1, column: 1))
        #expect(inner.mark == YAMLMark(line: 2, column: 3))
        #expect(inner["é"]?.mark == YAMLMark(line: 2, column: 6))
        guard case .sequence(let flow)? = inner["é"] else {
            Issue.record("not a sequence")
            return
        }
        #expect(flow[0].mark == YAMLMark(line: 2, column: 7))
        #expect(flow[1].mark == YAMLMark(line: 2, column: 10))
        #expect(flow[1]["k"]?.mark == YAMLMark(line: 2, column: 14))
        #expect(inner["seq"]?.mark == YAMLMark(line: 4, column: 5))
        guard case .sequence(let seq)? = inner["seq"] else {
            Issue.record("not a sequence")
            return
        }
        #expect(seq[0].mark == YAMLMark(line: 4, column: 7))
    }

    @Test(arguments: [
        ("a: *x", 1, 4, "unknown alias '*x'"),
        ("a: 1\n&x b: 2", 2, 1, "cannot be a key"),
        ("a: !!str 1", 1, 4, "tags"),
        ("? a\n: b", 1, 1, "complex keys"),
        ("%YAML 1.2\n---\na: 1", 1, 1, "directives"),
        ("a: 1\na: 2", 2, 1, "duplicate key 'a' (first at line 1)"),
        ("a: {b: 1, b: 2}", 1, 11, "duplicate key 'b'"),
        ("a:\n\tb: 1", 2, 1, "tab"),
        ("a: b: c", 1, 5, "mapping cannot start"),
        ("a: - b", 1, 4, "block sequence cannot start"),
        ("a: [1, 2", 1, 4, "not closed"),
        ("a: \"open", 1, 4, "not closed"),
        ("a: \"\\q\"", 1, 5, "unknown escape"),
        ("a: 1\n  b: 2", 2, 4, "mapping cannot start inside a plain value"),
        ("a: \"x\"\n  b: 2", 2, 3, "indented past"),
        ("a: 1\nb", 2, 2, "expected ':'"),
        ("a: [1] x", 1, 8, "unexpected"),
        ("a: @x", 1, 4, "cannot start a plain value"),
        ("- a\nb: 1", 2, 1, "unexpected content"),
        ("a: |0\n x", 1, 5, "indentation indicator"),
    ])
    func refusalsAreLocated(yaml: String, line: Int, column: Int, message: String) throws {
        let error = try #require(Self.error(yaml))
        #expect(error.mark == YAMLMark(line: line, column: column), "\(error)")
        #expect(error.problem.contains(message), "\(error)")
    }

    @Test func nestingIsBounded() throws {
        let deep = String(repeating: "[", count: YAMLReader.maxDepth + 5)
        let error = try #require(Self.error(deep))
        #expect(error.problem.contains("nesting") && error.mark.column == YAMLReader.maxDepth)
        let ok = String(repeating: "[", count: 900) + String(repeating: "]", count: 900)
        #expect(throws: Never.self) { try YAMLReader.read(ok) }
        let block = (0..<200).map { String(repeating: "  ", count: $0) + "k\($0):" }.joined(separator: "\n") + " v"
        #expect(throws: Never.self) { try YAMLReader.read(block) }
    }

    @Test func scalarResolutionForLuaConfig() {
        func s(_ text: String, _ style: YAMLNode.Scalar.Style = .plain) -> YAMLNode.Scalar { YAMLNode.Scalar(text, style: style) }
        #expect(s("true").bool == true && s("Off").bool == false && s("yes").bool == true && s("maybe").bool == nil)
        #expect(s("true", .doubleQuoted).bool == nil)
        #expect(s("42").int == 42 && s("-0x1F").int == -31 && s("0o17").int == 15 && s("017").int == 15 && s("0b101").int == 5)
        #expect(s("1_000").int == 1000 && s("1.5").int == nil && s("42", .singleQuoted).int == nil)
        #expect(s("1.5").float == 1.5 && s("-.inf").float == -.infinity && s(".NaN").float?.isNaN == true && s("x").float == nil)
    }

    /// Every configuration the repository ships reads, and the same text with CRLF line
    /// breaks reads to the same tree.
    @Test func theRepositorysConfigurationsRead() throws {
        let root = Self.repositoryRoot()
        for path in ["config/sluice.yaml", "config/default.yaml"] + Self.files(in: root + "/examples", ending: ".yaml") {
            let full = path.hasPrefix("/") ? path : root + "/" + path
            guard let text = FileContents.text(atPath: full) else { continue }
            let tree = try YAMLReader.read(text).map(Plain.init)
            #expect(tree != nil, "\(path)")
            let crlf = text.replacingLineBreaks(with: "\r\n")
            #expect(try YAMLReader.read(crlf).map(Plain.init) == tree, "\(path) with CRLF")
        }
    }

    /// Random inputs built from YAML's own characters, and mutations of a real
    /// configuration (bytes dropped, duplicated, replaced, the text cut anywhere): a tree or a
    /// located error, never a crash or an error at 0:0. Bounded: a fixed seed, 4,000 inputs.
    @Test func randomInputsGiveATreeOrALocatedError() {
        var rng = SplitMix(seed: 0x5eed)
        let alphabet = Array("ab: -#|>'\"{}[],&*!?%@`\\\n\n\t  \r0.é".unicodeScalars)
        let base = Array(
            "listen: [\"127.0.0.1:3128\"]\npolicies:\n  default:\n    adapters:\n      - headers: { set: { X-A: 'b' } }\n    src: |\n      x\n"
                .utf8)
        let replacements = Array(" :-\n{[\"'|#\t".utf8)
        for round in 0..<4_000 {
            var text: String
            if round % 2 == 0 {
                let count = Int(rng.next() % 80)
                text = String(
                    String.UnicodeScalarView((0..<count).map { _ in alphabet[Int(rng.next() % UInt64(alphabet.count))] }))
            } else {
                var bytes = base
                for _ in 0..<(1 + rng.next() % 4) {
                    let at = Int(rng.next() % UInt64(bytes.count))
                    switch rng.next() % 4 {
                    case 0: bytes.remove(at: at)
                    case 1: bytes.insert(bytes[at], at: at)
                    case 2: bytes[at] = replacements[Int(rng.next() % UInt64(replacements.count))]
                    default: bytes = Array(bytes[..<at])
                    }
                    if bytes.isEmpty { bytes = [0x61] }
                }
                text = String(decoding: bytes, as: UTF8.self)
            }
            do {
                _ = try YAMLReader.read(text)
            } catch {
                #expect(
                    error.mark.line >= 1 && error.mark.column >= 1 && !error.problem.isEmpty, "\(text.debugDescription): \(error)"
                )
            }
        }
    }

    static func repositoryRoot() -> String {
        var path = #filePath
        for _ in 0..<3 { path = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)]) }
        return path
    }

    static func files(in directory: String, ending suffix: String) -> [String] {
        guard let dir = opendir(directory) else { return [] }
        defer { closedir(dir) }
        var out: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name.hasSuffix(suffix) { out.append(directory + "/" + name) }
        }
        return out.sorted()
    }
}

/// A small deterministic generator (SplitMix64) for the bounded random test.
struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

extension String {
    fileprivate func replacingLineBreaks(with lineBreak: String) -> String {
        split(separator: "\n", omittingEmptySubsequences: false).joined(separator: lineBreak)
    }
}

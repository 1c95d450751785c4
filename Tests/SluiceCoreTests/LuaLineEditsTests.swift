import HTTPTypes
import Testing

@testable import SluiceCore

/// `LuaLineEdits`: scripts' header edits of lines, as bytes in one buffer.
struct LuaLineEditsTests {
    static func entries(_ edits: LuaLineEdits) -> [String] {
        var out: [String] = []
        edits.withEntries { entries in
            for e in entries {
                out.append(
                    "\(e.operation) \(String(decoding: e.name, as: UTF8.self))=\(String(decoding: e.value, as: UTF8.self))")
            }
        }
        return out
    }

    static func append(_ edits: inout LuaLineEdits, _ operation: LuaLineEdits.Operation, _ name: String, _ value: String) {
        Array(name.utf8).withUnsafeBytes { name in
            Array(value.utf8).withUnsafeBytes { edits.append(operation, name: name, value: $0) }
        }
    }

    @Test func editsComeBackInOrderWithTheirBytes() {
        var edits = LuaLineEdits()
        #expect(edits.isEmpty && edits.count == 0 && Self.entries(edits).isEmpty)
        Self.append(&edits, .set, "X-Seen", "bench")
        Self.append(&edits, .remove, "Accept", "")
        // Past the first buffer's 128 bytes: it grows, keeping what it held.
        let long = String(repeating: "v", count: 300)
        Self.append(&edits, .add, "X-Long", long)
        #expect(edits.count == 3 && !edits.isEmpty)
        #expect(Self.entries(edits) == ["set X-Seen=bench", "remove Accept=", "add X-Long=\(long)"])
        #expect(
            edits
                == LuaLineEdits([
                    .set(HTTPField.Name("X-Seen")!, "bench"), .remove(HTTPField.Name("Accept")!),
                    .add(HTTPField.Name("X-Long")!, long),
                ]))
    }

    /// A copy (a `fail_open` call's view) is not changed by an edit of the original.
    @Test func aCopyKeepsItsEdits() {
        var edits = LuaLineEdits([.set(HTTPField.Name("A")!, "1")])
        let copy = edits
        Self.append(&edits, .add, "B", "2")
        #expect(Self.entries(copy) == ["set A=1"])
        #expect(Self.entries(edits) == ["set A=1", "add B=2"])
        #expect(copy != edits)
    }

    @Test func touchComparesNamesInAnyCase() {
        let edits = LuaLineEdits([.add(HTTPField.Name("X-Seen")!, "1")])
        #expect(Array("x-SEEN".utf8).withUnsafeBytes { edits.touch($0) })
        #expect(!Array("x-see".utf8).withUnsafeBytes { edits.touch($0) })
        #expect(!Array("x-seen".utf8).withUnsafeBytes { LuaLineEdits().touch($0) })
    }

    /// The masks are RFC 9110's tchar, byte by byte.
    @Test func namesAreTokens() {
        let tchar = Set("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ".utf8)
        for b in 0...255 {
            let byte = UInt8(b)
            #expect([byte].withUnsafeBytes { LuaLineEdits.isName($0) } == tchar.contains(byte), "byte \(b)")
        }
        #expect(!LuaLineEdits.isName(UnsafeRawBufferPointer(start: nil, count: 0)))
        #expect(Array("X-Seen".utf8).withUnsafeBytes { LuaLineEdits.isName($0) })
        #expect(!Array("X Seen".utf8).withUnsafeBytes { LuaLineEdits.isName($0) })
        #expect(!Array("X:Seen".utf8).withUnsafeBytes { LuaLineEdits.isName($0) })
    }

    @Test func plainValuesAreVisibleASCIIWithInnerSpaces() {
        func plain(_ s: String) -> Bool { Array(s.utf8).withUnsafeBytes { LuaLineEdits.isPlainValue($0) } }
        #expect(plain("bench") && plain("a b\tc") && plain("x"))
        #expect(!plain("") && !plain(" a") && !plain("a ") && !plain("a\u{1}b") && !plain("caf\u{e9}") && !plain("a\u{7f}"))
    }
}

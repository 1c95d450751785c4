import Testing

@testable import SluiceCore

/// `SWAR`'s masks against the byte-by-byte rule each stands for: every byte value at every
/// position of a word whose other bytes pass, and words of random bytes (a mask is wrong
/// when a borrow or carry leaks between bytes, which only mixed words show). The parsers'
/// line and value scans and the access log's escaping skip whole words on these masks.
@Suite struct SWARTests {
    /// The word of `bytes` (eight of them) as `SWAR.load` reads it.
    private func word(_ bytes: [UInt8]) -> UInt64 {
        bytes.withUnsafeBytes { SWAR.load($0.baseAddress!) }
    }

    /// Every rule, with the filler byte that passes it.
    private static let rules:
        [(name: String, filler: UInt8, matches: @Sendable (UInt8) -> Bool, mask: @Sendable (UInt64) -> UInt64)] = [
            ("controlOrDEL", 0x61, { $0 < 0x20 || $0 == 0x7F }, SWAR.controlOrDEL),
            ("below(0x21)", 0x61, { $0 < 0x21 }, { SWAR.below(0x21, $0) }),
            ("below(0x80)", 0x90, { $0 < 0x80 }, { SWAR.below(0x80, $0) }),
            ("equal(0x3A)", 0x61, { $0 == 0x3A }, { SWAR.equal(0x3A, $0) }),
            (
                "notLetterOrDash", 0x2D,
                { !($0 == 0x2D || (0x41...0x5A).contains($0) || (0x61...0x7A).contains($0)) }, SWAR.notLetterOrDash
            ),
        ]

    @Test(arguments: 0..<rules.count)
    func eachByteAtEachPosition(rule: Int) {
        let (name, filler, matches, mask) = Self.rules[rule]
        #expect(mask(word([UInt8](repeating: filler, count: 8))) == 0, "\(name) of the filler")
        for position in 0..<8 {
            for value in 0...255 {
                var bytes = [UInt8](repeating: filler, count: 8)
                bytes[position] = UInt8(value)
                #expect(
                    (mask(word(bytes)) != 0) == matches(UInt8(value)),
                    "\(name): byte 0x\(String(value, radix: 16)) at \(position)")
            }
        }
    }

    /// Random words: a mask is non-zero exactly when some byte matches, and its first marked
    /// byte is the first that matches (`firstMatch`), whatever the bytes after it (where
    /// borrows may mark bytes that do not) — also for the `|` of two masks.
    @Test(arguments: 0..<rules.count)
    func randomWords(rule: Int) {
        let (name, _, matches, mask) = Self.rules[rule]
        var generator = SystemRandomNumberGenerator()
        // Bytes drawn mostly from around the rule's bounds, where a leaking borrow shows.
        let pool: [UInt8] = Array(0...0x40) + [0x5A, 0x5B, 0x60, 0x61, 0x7A, 0x7B, 0x7F, 0x80, 0xAD, 0xE1, 0xFF]
        for _ in 0..<20_000 {
            let bytes = (0..<8).map { _ in pool.randomElement(using: &generator)! }
            #expect((mask(word(bytes)) != 0) == bytes.contains(where: matches), "\(name): \(bytes)")
            guard let first = bytes.firstIndex(where: matches) else { continue }
            #expect(SWAR.firstMatch(mask(word(bytes))) == first, "\(name): \(bytes)")
            let either = mask(word(bytes)) | SWAR.equal(0x3A, word(bytes))
            let firstOfEither = bytes.firstIndex(where: { matches($0) || $0 == 0x3A })!
            #expect(SWAR.firstMatch(either) == firstOfEither, "\(name) | equal(0x3A): \(bytes)")
        }
    }

    /// `lineEnd` finds the first CR or LF from every start of random buffers, as a byte-by-byte
    /// scan does: in a word (from its mask), in the tail shorter than a word, or nowhere.
    @Test func lineEndAgainstAByteScan() {
        var generator = SystemRandomNumberGenerator()
        let pool: [UInt8] = [0x0A, 0x0D, 0x0B, 0x0C, 0x0E, 0x09, 0x20, 0x41, 0x61, 0x8A, 0x8D, 0xFF]
        for _ in 0..<2_000 {
            let count = Int.random(in: 0...40, using: &generator)
            let bytes = (0..<count).map { _ in
                Int.random(in: 0..<8, using: &generator) == 0 ? pool.randomElement(using: &generator)! : 0x61
            }
            bytes.withUnsafeBytes { raw in
                for start in 0...count {
                    let expected = bytes[start...].firstIndex { $0 == 0x0D || $0 == 0x0A } ?? count
                    #expect(SWAR.lineEnd(raw, from: start) == expected, "\(bytes) from \(start)")
                }
            }
        }
    }

    /// `notLetterOrDash` marks every byte that is not a letter or `-`, not only the first:
    /// exact masks, so a dash never leaks into the byte after it.
    @Test func notLetterOrDashIsExactInEveryByte() {
        var generator = SystemRandomNumberGenerator()
        let pool: [UInt8] = [
            0x00, 0x0D, 0x2C, 0x2D, 0x2E, 0x30, 0x3A, 0x40, 0x41, 0x5A, 0x5B, 0x60, 0x61, 0x7A, 0x7B, 0xAD, 0xC1, 0xFF,
        ]
        for _ in 0..<20_000 {
            let bytes = (0..<8).map { _ in pool.randomElement(using: &generator)! }
            let mask = SWAR.notLetterOrDash(word(bytes))
            for (k, b) in bytes.enumerated() {
                let marked = mask >> (UInt64(k) * 8 + 7) & 1 == 1
                let isNameByte = b == 0x2D || (0x41...0x5A).contains(b) || (0x61...0x7A).contains(b)
                #expect(marked == !isNameByte, "byte \(k) of \(bytes)")
            }
        }
    }

    @Test func lowercasedChangesCapitalsOnly() {
        for value in 0...255 {
            var bytes = [UInt8](repeating: 0x41, count: 8)
            bytes[3] = UInt8(value)
            let lowered = withUnsafeBytes(of: SWAR.lowercased(word(bytes)).littleEndian) { Array($0) }
            let expected: UInt8 = value >= 0x41 && value <= 0x5A ? UInt8(value) | 0x20 : UInt8(value)
            #expect(lowered[3] == expected, "0x\(String(value, radix: 16))")
            #expect(lowered[0] == 0x61 && lowered[7] == 0x61)
        }
    }
}

import Testing

@testable import SluiceCore

/// `ShortCopy.copy` against the bytes it was given: every count from 0 to 40 (each branch and
/// its edges: 3/4, 7/8, 16/17), at every misalignment of source and destination, and not a
/// byte written outside the destination's range.
@Suite struct ShortCopyTests {
    @Test func everyCountAtEveryAlignment() {
        let source = (0..<64).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }
        for count in 0...40 {
            for from in 0..<8 {
                for to in 0..<8 {
                    var destination = [UInt8](repeating: 0xEE, count: 64)
                    source.withUnsafeBytes { src in
                        destination.withUnsafeMutableBytes { dst in
                            ShortCopy.copy(dst.baseAddress! + to, src.baseAddress! + from, count)
                        }
                    }
                    let expected =
                        [UInt8](repeating: 0xEE, count: to) + source[from..<(from + count)]
                        + [UInt8](repeating: 0xEE, count: 64 - to - count)
                    #expect(destination == expected, "count \(count), from \(from), to \(to)")
                }
            }
        }
    }
}

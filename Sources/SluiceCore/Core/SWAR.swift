/// Byte tests on eight bytes at once ("SIMD within a register"), for the scans that look at
/// every byte of a request or response: the parsers' line and field scans, the access log's
/// JSON escaping. A test returns a mask that is non-zero when *some* byte of the word matches
/// (masks combine with `|`); the callers skip a word whose mask is zero, and in one whose mask
/// is not take the first match from it (`firstMatch`) or look at its bytes. Only the first
/// matching byte is marked exactly: a borrow can mark bytes above it that do not match.
///
/// Threading: pure functions of their arguments, callable from any thread.
public enum SWAR {
    // Computed, not stored: a stored global costs a lazy-initialisation check per use.
    @inlinable static var ones: UInt64 { 0x0101_0101_0101_0101 }
    @inlinable static var high: UInt64 { 0x8080_8080_8080_8080 }

    /// Non-zero when some byte of `word` is below `limit` (`limit` ≤ 0x80). A byte's
    /// subtraction only borrows from the byte above it once a byte below it already matched,
    /// and bytes of 0x80 and above never match, so zero means no byte is below `limit`.
    @inlinable @inline(__always)
    public static func below(_ limit: UInt8, _ word: UInt64) -> UInt64 {
        (word &- ones &* UInt64(limit)) & ~word & high
    }

    /// The index (0–7) of the first byte of a `load`ed word that a non-zero mask of `below`,
    /// `equal`, `controlOrDEL` or `notLetterOrDash` (or an `|` of them) marks: the lowest
    /// marked byte. Below the first matching byte no subtraction borrows, so no byte there is
    /// marked; the first matching byte always is (`notLetterOrDash` marks every byte exactly).
    @inlinable @inline(__always)
    public static func firstMatch(_ mask: UInt64) -> Int {
        mask.trailingZeroBitCount >> 3
    }

    /// Non-zero when some byte of `word` equals `byte`.
    @inlinable @inline(__always)
    public static func equal(_ byte: UInt8, _ word: UInt64) -> UInt64 {
        below(1, word ^ (ones &* UInt64(byte)))
    }

    /// Non-zero when some byte of `word` is a control byte (below 0x20: NUL, HTAB, CR, LF…) or
    /// DEL: the bytes a field value scan must look at one by one.
    @inlinable @inline(__always)
    public static func controlOrDEL(_ word: UInt64) -> UInt64 {
        below(0x20, word) | equal(0x7F, word)
    }

    /// Non-zero when some byte of `word` is neither an ASCII letter nor `-`: the bytes a
    /// field name's scan must look at one by one (a name is mostly letters and dashes, and
    /// ends at its colon). Exact in every byte, not only the first: no sum carries between
    /// bytes, since each works on seven bits.
    @inlinable @inline(__always)
    public static func notLetterOrDash(_ word: UInt64) -> UInt64 {
        let low7 = word & ~high
        // Bit 5 set folds the capitals onto the small letters (and nothing else onto them).
        let folded = low7 | ones &* 0x20
        let letter = (folded &+ ones &* 0x1F) & ~(folded &+ ones &* 0x05) & ~word & high
        // A byte is `-` when its XOR with `-` is zero: bit 7 of (low seven bits + 0x7F) | byte
        // is clear only for a zero byte.
        let x = word ^ ones &* 0x2D
        let dash = ~((x & ~high) &+ ones &* 0x7F | x) & high
        return ~(letter | dash) & high
    }

    /// `word` with its ASCII capitals (0x41–0x5A) made lower case and every other byte kept.
    @inlinable @inline(__always)
    public static func lowercased(_ word: UInt64) -> UInt64 {
        // On the low seven bits no sum carries into the next byte; bit 7 of the first sum is
        // set from 0x41 up, of the second from 0x5B up.
        let low7 = word & ~high
        let capital = (low7 &+ ones &* 0x3F) & ~(low7 &+ ones &* 0x25) & ~word & high
        return word | capital >> 2
    }

    /// The eight bytes at `pointer` (any alignment) as a little-endian word.
    @inlinable @inline(__always)
    public static func load(_ pointer: UnsafeRawPointer) -> UInt64 {
        UInt64(littleEndian: pointer.loadUnaligned(as: UInt64.self))
    }

    /// The index of the first CR or LF in `bytes` at or after `start`, or `bytes.count`:
    /// eight bytes at a time, the one in a word found from its mask (`firstMatch`), and the
    /// last bytes of `bytes` one by one.
    @inlinable
    public static func lineEnd(_ bytes: UnsafeRawBufferPointer, from start: Int) -> Int {
        var i = start
        if let base = bytes.baseAddress {
            while i + 8 <= bytes.count {
                let word = load(base + i)
                let mask = equal(0x0D, word) | equal(0x0A, word)
                if mask != 0 { return i + firstMatch(mask) }
                i += 8
            }
        }
        while i < bytes.count, bytes[i] != 0x0D, bytes[i] != 0x0A { i += 1 }
        return i
    }
}

/// Copies of a few bytes — a JSON key with its punctuation, a header name, a short value —
/// without a call to `memcpy`: an access-log line and a forwarded head make some fifty such
/// copies, most under 17 bytes, and a call costs more than the copy (some 25 instructions
/// against 8). Longer runs go to `memcpy`.
///
/// Threading: a pure function of its arguments, callable from any thread.
public enum ShortCopy {
    /// Copies `count` bytes from `source` to `destination`; the two may not overlap.
    @inlinable @inline(__always)
    public static func copy(_ destination: UnsafeMutableRawPointer, _ source: UnsafeRawPointer, _ count: Int) {
        if count >= 8 {
            guard count <= 16 else {
                destination.copyMemory(from: source, byteCount: count)
                return
            }
            // Two words that overlap for a count under 16: the first eight bytes and the last.
            let head = source.loadUnaligned(as: UInt64.self)
            let tail = source.loadUnaligned(fromByteOffset: count - 8, as: UInt64.self)
            destination.storeBytes(of: head, as: UInt64.self)
            destination.storeBytes(of: tail, toByteOffset: count - 8, as: UInt64.self)
        } else if count >= 4 {
            let head = source.loadUnaligned(as: UInt32.self)
            let tail = source.loadUnaligned(fromByteOffset: count - 4, as: UInt32.self)
            destination.storeBytes(of: head, as: UInt32.self)
            destination.storeBytes(of: tail, toByteOffset: count - 4, as: UInt32.self)
        } else {
            for i in 0..<count {
                destination.storeBytes(of: source.load(fromByteOffset: i, as: UInt8.self), toByteOffset: i, as: UInt8.self)
            }
        }
    }

    /// `copy` for typed byte pointers.
    @inlinable @inline(__always)
    public static func copy(_ destination: UnsafeMutablePointer<UInt8>, _ source: UnsafePointer<UInt8>, _ count: Int) {
        copy(UnsafeMutableRawPointer(destination), UnsafeRawPointer(source), count)
    }
}

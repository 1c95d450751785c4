import SluiceCore

/// Bytes written in place into room made ahead: an array filled ahead and a count of the bytes
/// in use. An append to an array checks its uniqueness and capacity each time (some 70
/// instructions for a run of bytes, 25 for one byte); a write here checks once, however many
/// pieces it puts. The request's forwarded lines (`RequestHeaderLines.Builder`) and the
/// collected response head (`ResponseHeadCollector`) are written this way.
///
/// A value: a copy shares the room until either writes, as arrays do. Twelve bytes (the count
/// is 32-bit; a head is far below 4 GiB), so a builder holding one still fits an
/// existential's inline buffer.
///
/// Threading: a value, used on one thread at a time (a worker's).
struct ByteRoom: Sendable {
    private var storage: [UInt8]
    private var used: UInt32 = 0

    /// Room for `capacity` bytes made at once (none: made at the first write).
    init(capacity: Int = 0) {
        storage = Array(repeating: 0, count: capacity)
    }

    /// How many bytes are in use.
    var count: Int { Int(used) }
    /// The bytes in use.
    var bytes: ArraySlice<UInt8> { storage[..<count] }

    /// Forgets the bytes, keeping the room.
    mutating func removeAll() { used = 0 }

    /// Writes at most `count` bytes at the end through `body`, which returns how many it
    /// wrote; room is made first (doubling, at least 256 bytes).
    @inline(__always)
    mutating func write(atMost count: Int, _ body: (UnsafeMutablePointer<UInt8>) -> Int) {
        guard count > 0 else { return }
        let at = self.count
        if at + count > storage.count { storage.append(contentsOf: repeatElement(0, count: max(count, storage.count, 256))) }
        used = UInt32(at + storage.withUnsafeMutableBufferPointer { body($0.baseAddress! + at) })
    }

    /// Appends `bytes`.
    @inline(__always)
    mutating func append(_ bytes: UnsafeRawBufferPointer) {
        guard let source = bytes.baseAddress else { return }
        write(atMost: bytes.count) { out in
            ShortCopy.copy(UnsafeMutableRawPointer(out), source, bytes.count)
            return bytes.count
        }
    }

    /// Calls `body` with the bytes in use.
    func withUnsafeBufferPointer<R>(_ body: (UnsafeBufferPointer<UInt8>) -> R) -> R {
        storage.withUnsafeBufferPointer { body(UnsafeBufferPointer(rebasing: $0[..<count])) }
    }
}

import Testing

@testable import SluiceServer

#if canImport(Glibc)
    import Glibc
#endif

/// `DiskBlockVerification` and `DiskFileIdentity` as values, then the tier's use of them for a
/// hit the kernel sends (`Reader.prepareKernelSend`): each block verified once per identity of
/// its file, again after any change, and a damaged block never passed as good.
@Suite struct DiskBlockVerificationTests {
    static func identity(inode: UInt64 = 7, size: Int64 = 100, changed: Int64 = 1000) -> DiskFileIdentity {
        DiskFileIdentity(
            device: 1, inode: inode, size: size, modified: .init(seconds: 900, nanoseconds: 5),
            changed: .init(seconds: changed, nanoseconds: 250))
    }

    @Test func blocksAreKnownOnlyAtTheIdentityTheyWereVerifiedAt() {
        let a = Self.identity()
        var v = DiskBlockVerification(identity: a)
        #expect(!v.contains(0, at: a) && v.count == 0)
        v.insert(0, at: a)
        v.insert(130, at: a)
        #expect(v.contains(0, at: a) && v.contains(130, at: a) && !v.contains(1, at: a) && !v.contains(500, at: a))
        #expect(v.count == 2)
        for other in [Self.identity(inode: 8), Self.identity(size: 101), Self.identity(changed: 1001)] {
            #expect(!v.contains(0, at: other))
        }
        // A block verified at a new identity starts the record over.
        let b = Self.identity(changed: 2000)
        v.insert(3, at: b)
        #expect(v.identity == b && v.count == 1 && v.contains(3, at: b) && !v.contains(0, at: a) && !v.contains(0, at: b))
    }

    @Test func aNewerRecordJoinsAtTheSameIdentityAndReplacesAtAnother() {
        let a = Self.identity()
        var kept = DiskBlockVerification(identity: a)
        kept.insert(1, at: a)
        var reader = kept
        reader.insert(70, at: a)
        var other = DiskBlockVerification(identity: a)
        other.insert(2, at: a)
        kept.merge(other)
        kept.merge(reader)
        #expect(kept.count == 3 && [1, 2, 70].allSatisfy { kept.contains($0, at: a) })
        let b = Self.identity(inode: 9)
        var replaced = DiskBlockVerification(identity: b)
        replaced.insert(5, at: b)
        kept.merge(replaced)
        #expect(kept == replaced)
    }

    @Test func aFileIsSettledOnlyASecondAfterItsLastChange() {
        let id = Self.identity(changed: 1000)
        #expect(!id.isSettled(now: .init(seconds: 1000, nanoseconds: 900)))
        #expect(!id.isSettled(now: .init(seconds: 1001, nanoseconds: 249)))
        #expect(id.isSettled(now: .init(seconds: 1001, nanoseconds: 250)))
        #expect(id.isSettled(now: .init(seconds: 5000, nanoseconds: 0)))
    }

    // MARK: the tier

    typealias Tier = DiskCacheTierTests
    static let block = Tier.block

    func store(_ s: Tier.Scratch, _ body: [UInt8]) throws -> DiskCacheTier {
        let t = try Tier().tier(s)
        #expect(Tier().store(t, "k", "m", body))
        return t
    }

    func bodyFile(_ s: Tier.Scratch) -> String { s.path + "/" + s.files.first { $0.hasSuffix(".body") }! }

    @Test func aSettledFileIsVerifiedOnceThenAgainAfterItChanges() throws {
        let s = Tier.Scratch()
        let body = Tier.body(3, 6 * Self.block)
        let t = try store(s, body)
        // Fresh: verified but not remembered (its ctime could repeat within the clock's tick).
        try #require(t.open(key: "k")).prepareKernelSend(0..<body.count)
        try #require(t.open(key: "k")).prepareKernelSend(0..<body.count)
        #expect(t.verifiedBytes.load(ordering: .relaxed) == UInt64(2 * body.count))
        usleep(1_100_000)
        // A range verifies only the blocks it overlaps; then the rest; then nothing.
        try #require(t.open(key: "k")).prepareKernelSend(Self.block + 5..<2 * Self.block + 1)
        #expect(t.verifiedBytes.load(ordering: .relaxed) == UInt64(2 * body.count + 2 * Self.block))
        try #require(t.open(key: "k")).prepareKernelSend(0..<body.count)
        try #require(t.open(key: "k")).prepareKernelSend(0..<body.count)
        #expect(t.verifiedBytes.load(ordering: .relaxed) == UInt64(3 * body.count))
        // Rewritten in place with the same bytes (its ctime changes): every block again.
        let fd = open(bodyFile(s), O_RDWR)
        var byte: UInt8 = 0
        _ = pread(fd, &byte, 1, 0)
        _ = pwrite(fd, &byte, 1, 0)
        close(fd)
        try #require(t.open(key: "k")).prepareKernelSend(0..<body.count)
        #expect(t.verifiedBytes.load(ordering: .relaxed) == UInt64(4 * body.count))
    }

    @Test func aBlockDamagedInPlaceAfterItWasVerifiedIsFoundAndTheEntryDropped() throws {
        let s = Tier.Scratch()
        let body = Tier.body(4, 6 * Self.block)
        let t = try store(s, body)
        usleep(1_100_000)
        try #require(t.open(key: "k")).prepareKernelSend(0..<body.count)
        Tier().corrupt(bodyFile(s), at: 4 * Self.block + 9)
        let r = try #require(t.open(key: "k"))
        #expect(throws: DiskCacheTier.CorruptEntry(block: 4)) { try r.prepareKernelSend(0..<body.count) }
        #expect(t.open(key: "k") == nil && s.files.isEmpty)
    }

    @Test func aFileReplacedOrTruncatedBehindTheTierIsNeverPassed() throws {
        let s = Tier.Scratch()
        let body = Tier.body(5, 3 * Self.block)
        let t = try store(s, body)
        usleep(1_100_000)
        try #require(t.open(key: "k")).prepareKernelSend(0..<body.count)
        // Replaced (a new inode) by a copy with one byte changed.
        let path = bodyFile(s)
        let copy = path + ".new"
        let original = open(path, O_RDONLY)
        var bytes = [UInt8](repeating: 0, count: Int(lseek(original, 0, SEEK_END)))
        _ = pread(original, &bytes, bytes.count, 0)
        close(original)
        bytes[2 * Self.block + 1] ^= 1
        let out = open(copy, O_WRONLY | O_CREAT, 0o600)
        _ = write(out, bytes, bytes.count)
        close(out)
        rename(copy, path)
        let r = try #require(t.open(key: "k"))
        #expect(throws: DiskCacheTier.CorruptEntry(block: 2)) { try r.prepareKernelSend(0..<body.count) }

        // Truncated: refused before any block is read.
        #expect(Tier().store(t, "k", "m", body))
        let reader = try #require(t.open(key: "k"))
        truncate(bodyFile(s), off_t(body.count))
        #expect(throws: DiskCacheTier.CorruptEntry(block: 0)) { try reader.prepareKernelSend(0..<body.count) }
    }
}

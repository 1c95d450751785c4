import Testing

@testable import SluiceServer

#if canImport(Glibc)
    import Glibc
#endif

/// `DiskDecodedRecords` as a value (bounded, least recently used first out), then the tier's
/// use of it: a settled record is read and verified once, its decoded head kept beside it, and
/// a record file changed behind the tier is read and verified again.
@Suite struct DiskDecodedRecordsTests {
    typealias Tier = DiskCacheTierTests

    static func record(_ generation: UInt64, metadata: Int = 100, changed: Int64 = 1000) -> DiskDecodedRecords.Record {
        DiskDecodedRecords.Record(
            identity: DiskBlockVerificationTests.identity(inode: generation, changed: changed),
            record: DiskEntryRecord(
                key: Array("key".utf8), metadata: [UInt8](repeating: 1, count: metadata), bodyLength: 10,
                blockSize: 4096, generation: generation, trailerDigest: Digest32(bytes: [UInt8](repeating: 0, count: 32))),
            trailer: [UInt8](repeating: 0, count: 32), recordFile: "r", bodyFile: "b")
    }

    @Test func keptRecordsStayWithinTheBudgetLeastRecentlyUsedFirstOut() {
        let size = Self.record(1).bytes
        var kept = DiskDecodedRecords(budget: 16 * size)
        for g in 1...16 { kept.keep("n\(g)", Self.record(UInt64(g))) }
        #expect(kept.count == 16 && kept.bytes == 16 * size)
        #expect(kept.lookUp("n1", generation: 1) != nil)
        #expect(kept.lookUp("n2", generation: 9) == nil, "another generation's record is not the entry's")
        kept.keep("n17", Self.record(17))
        #expect(kept.count == 16 && kept.lookUp("n2", generation: 2) == nil && kept.lookUp("n1", generation: 1) != nil)
        // Larger than an eighth of the budget: not kept (nor does it evict anything).
        kept.keep("big", Self.record(5, metadata: size))
        #expect(kept.count == 16 && kept.lookUp("big", generation: 5) == nil)
        kept.remove("n1")
        #expect(kept.count == 15 && kept.bytes == 15 * size)
    }

    @Test func aDecodingAttachesOnlyToTheRecordReadAtItsIdentity() {
        var kept = DiskDecodedRecords()
        kept.keep("n", Self.record(1))
        kept.attach("n", identity: DiskBlockVerificationTests.identity(inode: 1, changed: 2000), "stale")
        #expect(kept.lookUp("n", generation: 1)?.decoded == nil)
        kept.attach("n", identity: Self.record(1).identity, "head")
        #expect(kept.lookUp("n", generation: 1)?.decoded as? String == "head")
    }

    func recordFile(_ s: Tier.Scratch) -> String { s.path + "/" + s.files.first { $0.hasSuffix(".meta") }! }

    @Test func aSettledRecordIsReadOnceAndAgainAfterItChanges() throws {
        let s = Tier.Scratch()
        let t = try Tier().tier(s)
        #expect(Tier().store(t, "k", "head", Tier.body(1, 3 * Tier.block)))
        // Fresh: read, not kept (its ctime could repeat within the clock's tick).
        try #require(t.open(key: "k")).attachDecoded("decoded")
        #expect(try #require(t.open(key: "k")).decoded == nil)
        usleep(1_100_000)
        try #require(t.open(key: "k")).attachDecoded("decoded")
        let kept = try #require(t.open(key: "k"))
        #expect(kept.decoded as? String == "decoded" && kept.metadata == Array("head".utf8))
        #expect(try Tier().readAll(t, "k")?.body == Tier.body(1, 3 * Tier.block))

        // A valid record written behind the tier (same inode, its ctime moves): read again.
        let path = recordFile(s)
        let fd = open(path, O_RDWR)
        var bytes = [UInt8](repeating: 0, count: Int(lseek(fd, 0, SEEK_END)))
        _ = pread(fd, &bytes, bytes.count, 0)
        var record = try #require(DiskEntryRecord.decode(bytes))
        record.metadata = Array("HEAD".utf8)
        let encoded = record.encoded()
        _ = pwrite(fd, encoded, encoded.count, 0)
        close(fd)
        let reread = try #require(t.open(key: "k"))
        #expect(reread.decoded == nil && reread.metadata == Array("HEAD".utf8))

        // An update through the tier forgets the kept record too.
        usleep(1_100_000)
        try #require(t.open(key: "k")).attachDecoded("HEAD decoded")
        #expect(try #require(t.open(key: "k")).decoded as? String == "HEAD decoded")
        #expect(t.updateMetadata(key: "k", Array("next".utf8)))
        let updated = try #require(t.open(key: "k"))
        #expect(updated.decoded == nil && updated.metadata == Array("next".utf8))

        // A damaged record (its seal fails) is a miss, and the entry is dropped.
        usleep(1_100_000)
        _ = t.open(key: "k")
        #expect(try #require(t.open(key: "k")).metadata == Array("next".utf8))
        Tier().corrupt(recordFile(s), at: DiskEntryRecord.fixedSize)
        #expect(t.open(key: "k") == nil && s.files.isEmpty)
    }

    @Test func aBodyTruncatedBehindAKeptRecordIsAMiss() throws {
        let s = Tier.Scratch()
        let t = try Tier().tier(s)
        let body = Tier.body(2, 2 * Tier.block)
        #expect(Tier().store(t, "k", "head", body))
        usleep(1_100_000)
        _ = try #require(t.open(key: "k"))
        truncate(s.path + "/" + s.files.first { $0.hasSuffix(".body") }!, off_t(body.count))
        #expect(t.open(key: "k") == nil && s.files.isEmpty)
    }
}

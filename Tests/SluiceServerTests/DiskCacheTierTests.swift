import SluiceCore
import Synchronization
import Testing

@testable import SluiceServer

#if canImport(Glibc)
    import Glibc
#endif

/// `DiskCacheTier` on a real directory under /tmp (small blocks, so bodies span many):
/// round trips, aborts, LRU eviction by size, the start-up scan over torn and garbage files,
/// corruption found on read, concurrent writers of one key, readers of evicted entries, the
/// failure log. The kill -9 property and RLIMIT_FSIZE are in Tests/e2e/test_disk_tier.py.
@Suite struct DiskCacheTierTests {
    static let block = 4096

    final class Lines: Sendable {
        let lines = Mutex<[String]>([])
        var all: [String] { lines.withLock { $0 } }
        var sink: @Sendable (String) -> Void { { line in self.lines.withLock { $0.append(line) } } }
    }

    /// A fresh directory, removed when the test's scope ends.
    final class Scratch {
        let path: String
        init() {
            var template = Array("/tmp/sluice-disk-tier-XXXXXX".utf8CString)
            path = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        }
        deinit {
            for f in files { unlink(path + "/" + f) }
            rmdir(path)
        }
        var files: [String] {
            guard let d = opendir(path) else { return [] }
            defer { closedir(d) }
            var out: [String] = []
            while let e = readdir(d) {
                let n = withUnsafeBytes(of: e.pointee.d_name) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
                if n != "." && n != ".." { out.append(n) }
            }
            return out.sorted()
        }
        var bytesOnDisk: UInt64 {
            files.reduce(0) { total, f in
                var st = stat()
                stat(path + "/" + f, &st)
                return total + UInt64(st.st_size)
            }
        }
    }

    func tier(_ s: Scratch, capacity: UInt64 = 1 << 30, log: Lines = Lines()) throws -> DiskCacheTier {
        try DiskCacheTier(directory: s.path, capacity: capacity, blockSize: Self.block, log: log.sink)
    }

    static func body(_ seed: Int, _ count: Int) -> [UInt8] {
        (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ seed &* 7 &+ ($0 >> 8)) }
    }

    @discardableResult
    func store(_ t: DiskCacheTier, _ key: String, _ metadata: String, _ body: [UInt8], chunk: Int = 1000) -> Bool {
        guard let w = t.beginWrite(key: key, metadata: Array(metadata.utf8)) else { return false }
        var at = 0
        while at < body.count {
            let end = min(body.count, at + chunk)
            guard w.append(Array(body[at..<end])) else { return false }
            at = end
        }
        return w.commit()
    }

    @Test func aLookupOpensWithoutTouchingAndAHeadGoesOnlyToItsBody() throws {
        let s = Scratch()
        let t = try tier(s)
        #expect(store(t, "a", "ma", [1]) && store(t, "b", "mb", [2]))
        let a = t.open(key: "a", touch: false)
        #expect(t.namesOldestFirst == [DiskEntryNames.name(forKey: "a"), DiskEntryNames.name(forKey: "b")])
        t.touch(a!.name)
        #expect(t.namesOldestFirst.last == DiskEntryNames.name(forKey: "a"))
        // A 304's head for the body that was validated, not for a newer one stored since.
        let validated = a!.generation
        #expect(store(t, "a", "newer", [3]))
        #expect(!t.updateMetadata(key: "a", expectedGeneration: validated, Array("head".utf8)))
        #expect(try readAll(t, "a")?.metadata == "newer")
        let current = t.open(key: "a")!.generation
        #expect(t.updateMetadata(key: "a", expectedGeneration: current, Array("head".utf8)))
        #expect(try readAll(t, "a")?.metadata == "head")
    }

    @Test func variantsOfAKeyAreBoundedAndSurviveARestart() throws {
        let s = Scratch()
        do {
            let t = try tier(s)
            for i in 0..<(DiskCacheTier.maxVariants + 2) {
                let w = t.beginWrite(key: "k", variant: "v\(i)", metadata: Array("m\(i)".utf8))
                #expect(w?.append(Self.body(i, 5000)) == true && w?.commit() == true)
                if i == DiskCacheTier.maxVariants - 1 { _ = t.open(key: "k", variant: "v0") }  // v1, v2 oldest
            }
            #expect(store(t, "plain", "p", [1, 2, 3]))
            let kept = Set(t.variants(of: "k"))
            #expect(kept.count == DiskCacheTier.maxVariants && kept.contains("v0"))
            #expect(!kept.contains("v1") && !kept.contains("v2"))
            #expect(t.usage.entries == DiskCacheTier.maxVariants + 1)
        }
        let again = try tier(s)
        #expect(again.startScan.kept == DiskCacheTier.maxVariants + 1 && again.startScan.dropped == 0)
        #expect(Set(again.variants(of: "k")).count == DiskCacheTier.maxVariants && again.variants(of: "plain") == [""])
        let reader = again.open(key: "k", variant: "v9")
        #expect(reader.map { String(decoding: $0.metadata, as: UTF8.self) } == "m9")
        #expect(try reader?.next() == Array(Self.body(9, 5000).prefix(Self.block)))
        #expect(again.open(key: "k") == nil && again.open(key: "k", variant: "v1") == nil)
        again.remove(key: "k", variant: "v9")
        #expect(again.variants(of: "k").count == DiskCacheTier.maxVariants - 1)
        again.remove(key: "k")
        #expect(again.variants(of: "k").isEmpty && again.usage.entries == 1)
    }

    func readAll(_ t: DiskCacheTier, _ key: String) throws -> (metadata: String, body: [UInt8])? {
        guard let r = t.open(key: key) else { return nil }
        var out: [UInt8] = []
        while let chunk = try r.next() { out += chunk }
        #expect(UInt64(out.count) == r.bodyLength)
        return (String(decoding: r.metadata, as: UTF8.self), out)
    }

    func corrupt(_ path: String, at offset: Int) {
        let fd = open(path, O_RDWR)
        var b: UInt8 = 0
        _ = pread(fd, &b, 1, off_t(offset))
        b ^= 0x5a
        _ = pwrite(fd, &b, 1, off_t(offset))
        close(fd)
    }

    func file(_ s: Scratch, _ suffix: String) -> String { s.path + "/" + s.files.first { $0.hasSuffix(suffix) }! }

    @Test func roundTripOfBodiesOfEveryShape() throws {
        let s = Scratch()
        let t = try tier(s)
        let shapes = [0, 1, Self.block - 1, Self.block, Self.block + 1, 10 * Self.block + 123]
        for (i, n) in shapes.enumerated() { #expect(store(t, "k\(i)", "head \(i)", Self.body(i, n))) }
        for (i, n) in shapes.enumerated() {
            let got = try #require(try readAll(t, "k\(i)"))
            #expect(got.metadata == "head \(i)" && got.body == Self.body(i, n))
        }
        // The same through the reader's own buffer.
        let r = try #require(t.open(key: "k5"))
        var viaBuffer: [UInt8] = []
        while try r.withNextBlock({ viaBuffer += $0 }) != nil {}
        #expect(viaBuffer == Self.body(5, shapes[5]))
        #expect(t.open(key: "absent") == nil)
        #expect(t.usage.entries == shapes.count)
        #expect(t.usage.bytes == s.bytesOnDisk)
        #expect(s.files.filter { $0.hasSuffix(".meta") }.count == shapes.count)
    }

    @Test func abortedAndDroppedWritersLeaveNothing() throws {
        let s = Scratch()
        let t = try tier(s)
        let w = try #require(t.beginWrite(key: "a", metadata: [1, 2, 3]))
        #expect(w.append(Self.body(1, 5 * Self.block)))
        w.abort()
        #expect(!w.append([1]) && !w.commit())
        do {
            let dropped = t.beginWrite(key: "b", metadata: [])
            _ = dropped?.append(Self.body(2, 3 * Self.block))
        }
        #expect(t.open(key: "a") == nil && t.open(key: "b") == nil)
        #expect(s.files.isEmpty)
        #expect(t.usage == DiskCacheTier.Usage(entries: 0, bytes: 0))
        // An aborted rewrite of a stored key leaves the old entry as it was.
        #expect(store(t, "c", "old", Self.body(3, 2 * Self.block)))
        let again = try #require(t.beginWrite(key: "c", metadata: Array("new".utf8)))
        again.append(Self.body(4, 7 * Self.block))
        again.abort()
        #expect(try readAll(t, "c")?.metadata == "old")
        #expect(try readAll(t, "c")?.body == Self.body(3, 2 * Self.block))
        #expect(t.index.withLock { $0.writing.isEmpty && $0.reservedBytes == 0 })
    }

    @Test func evictsLeastRecentlyUsedToStayWithinCapacity() throws {
        let s = Scratch()
        let n = 8 * Self.block
        // Room for three entries (body + trailer + record), not four.
        let one = UInt64(n + 8 * 32 + 80 + 1 + 2 + 32)
        let t = try tier(s, capacity: 3 * one + 100)
        for k in ["a", "b", "c"] { #expect(store(t, k, k, Self.body(0, n))) }
        #expect(t.usage.entries == 3)
        _ = t.open(key: "a")  // a is now the most recently used: b goes first
        #expect(store(t, "d", "d", Self.body(1, n)))
        #expect(t.open(key: "b") == nil)
        #expect(t.open(key: "a") != nil && t.open(key: "c") != nil && t.open(key: "d") != nil)
        #expect(store(t, "e", "e", Self.body(2, n)))
        #expect(t.open(key: "a") == nil)  // oldest after the opens above: a, c, d
        #expect(t.usage.entries == 3 && t.usage.bytes <= t.capacity && s.bytesOnDisk <= t.capacity)
        #expect(t.namesOldestFirst == ["c", "d", "e"].map(DiskEntryNames.name(forKey:)))
        // A body that cannot fit even in an empty tier fails its writer, evicting nothing
        // beyond what it reserved, logging nothing, leaving no file.
        let log = Lines()
        let s2 = Scratch()
        let small = try tier(s2, capacity: UInt64(4 * Self.block), log: log)
        let w = try #require(small.beginWrite(key: "huge", metadata: []))
        #expect(!w.append(Self.body(3, 5 * Self.block)))
        #expect(!w.commit() && s2.files.isEmpty && log.all.isEmpty)
    }

    @Test func removeCancelsTheWritesOfItsKeyInProgress() throws {
        let s = Scratch()
        let t = try tier(s)
        #expect(store(t, "k", "stored", Self.body(1, 100)))
        let before = try #require(t.beginWrite(key: "k", metadata: Array("begun before".utf8)))
        let other = try #require(t.beginWrite(key: "other", metadata: []))
        before.append(Self.body(2, 3 * Self.block))
        t.remove(key: "k")  // invalidation while a response for k streams in
        let after = try #require(t.beginWrite(key: "k", metadata: Array("begun after".utf8)))
        after.append(Self.body(3, 100))
        #expect(!before.commit())
        #expect(t.open(key: "k") == nil)
        #expect(after.commit() && other.commit())
        #expect(try readAll(t, "k")?.metadata == "begun after")
        #expect(t.usage.entries == 2 && t.usage.bytes == s.bytesOnDisk && s.files.count == 4)
        // Nothing is left over: the next writer of k is not cancelled by the old removal.
        #expect(store(t, "k", "again", Self.body(4, 10)))
        #expect(t.index.withLock { $0.writing.isEmpty && $0.cancelled.isEmpty && $0.reservedBytes == 0 })
    }

    @Test func restartRebuildsTheIndexFromTheDirectory() throws {
        let s = Scratch()
        do {
            let t = try tier(s)
            for i in 0..<5 { #expect(store(t, "k\(i)", "m\(i)", Self.body(i, i * 3000))) }
            t.remove(key: "k4")
        }
        let t = try tier(s)
        #expect(t.startScan == DiskCacheTier.ScanSummary(kept: 4, dropped: 0, temporaries: 0, evicted: 0))
        for i in 0..<4 { #expect(try readAll(t, "k\(i)")?.body == Self.body(i, i * 3000)) }
        #expect(t.open(key: "k4") == nil)
        #expect(t.usage.bytes == s.bytesOnDisk)
        // A smaller capacity at restart evicts down to it.
        let before = t.usage.bytes
        _ = consume t
        let smaller = try tier(s, capacity: before / 2)
        #expect(smaller.startScan.evicted > 0 && smaller.usage.bytes <= before / 2 && s.bytesOnDisk <= before / 2)
    }

    @Test func theScanDropsTornGarbageAndOrphanedFilesAndNeverServesThem() throws {
        let s = Scratch()
        do {
            let t = try tier(s)
            for k in ["whole", "shortRecord", "shortBody", "garbageRecord", "orphan", "noBody"] {
                #expect(store(t, k, k, Self.body(1, 3 * Self.block)))
            }
            let name = { (k: String) in DiskEntryNames.name(forKey: k) }
            let p = { (f: String) in s.path + "/" + f }
            truncate(p(DiskEntryNames.record(name("shortRecord"))), 90)
            let shortBody = s.files.first { $0.hasPrefix(name("shortBody")) && $0.hasSuffix(".body") }!
            truncate(p(shortBody), off_t(2 * Self.block))
            let garbage = open(p(DiskEntryNames.record(name("garbageRecord"))), O_WRONLY | O_TRUNC)
            _ = write(garbage, "not a record at all, but long enough to have a header: .............................", 86)
            close(garbage)
            unlink(p(DiskEntryNames.record(name("orphan"))))
            unlink(p(s.files.first { $0.hasPrefix(name("noBody")) && $0.hasSuffix(".body") }!))
            close(open(p("unrelated.txt"), O_CREAT | O_WRONLY, 0o600))
            // A write in progress, as a kill leaves it.
            close(open(p(DiskEntryNames.bodyTemporary(name("inProgress"), 42)), O_CREAT | O_WRONLY, 0o600))
            close(open(p(DiskEntryNames.recordTemporary(name("inProgress"), 42)), O_CREAT | O_WRONLY, 0o600))
        }
        let t = try tier(s)
        // Dropped: the records of shortRecord, shortBody (its body is short), garbageRecord
        // and noBody (its body is gone), and the bodies of the first three and of orphan.
        #expect(t.startScan == DiskCacheTier.ScanSummary(kept: 1, dropped: 8, temporaries: 2, evicted: 0))
        #expect(try readAll(t, "whole")?.body == Self.body(1, 3 * Self.block))
        for k in ["shortRecord", "shortBody", "garbageRecord", "orphan", "noBody", "inProgress"] {
            #expect(t.open(key: k) == nil)
        }
        #expect(s.files.filter { $0 != "unrelated.txt" }.count == 2 && s.files.contains("unrelated.txt"))
        #expect(t.usage.bytes == s.bytesOnDisk)
    }

    @Test func aCorruptedByteIsFoundOnReadAndTheEntryDropped() throws {
        let s = Scratch()
        let t = try tier(s)
        let body = Self.body(5, 6 * Self.block)
        let name = { (k: String) in DiskEntryNames.name(forKey: k) }
        let bodyFile = { (k: String) in s.path + "/" + s.files.first { $0.hasPrefix(name(k)) && $0.hasSuffix(".body") }! }
        for k in ["block0", "block3", "metadata", "trailer", "later"] { #expect(store(t, k, "meta-\(k)", body)) }

        // A byte in block 3: blocks 0-2 come out, block 3 throws, the entry is gone.
        corrupt(bodyFile("block3"), at: 3 * Self.block + 17)
        let r = try #require(t.open(key: "block3"))
        for i in 0..<3 { #expect(try r.next() == Array(body[i * Self.block..<(i + 1) * Self.block])) }
        #expect(throws: DiskCacheTier.CorruptEntry(block: 3)) { try r.next() }
        #expect(try r.next() == nil)
        #expect(t.open(key: "block3") == nil && !s.files.contains { $0.hasPrefix(name("block3")) })

        // In block 0: not a byte comes out.
        corrupt(bodyFile("block0"), at: 5)
        let r0 = try #require(t.open(key: "block0"))
        #expect(throws: DiskCacheTier.CorruptEntry(block: 0)) { try r0.next() }

        // In the record's metadata or in the trailer: a miss at open, and the entry is dropped.
        corrupt(s.path + "/" + DiskEntryNames.record(name("metadata")), at: DiskEntryRecord.fixedSize + 8 + 2)
        #expect(t.open(key: "metadata") == nil)
        corrupt(bodyFile("trailer"), at: body.count + 40)
        #expect(t.open(key: "trailer") == nil)
        #expect(t.usage.entries == 1 && t.usage.bytes == s.bytesOnDisk)
        #expect(try readAll(t, "later")?.body == body)
        // A file deleted behind the tier's back: a miss, and the entry is forgotten.
        unlink(bodyFile("later"))
        #expect(t.open(key: "later") == nil)
        #expect(t.usage == DiskCacheTier.Usage(entries: 0, bytes: 0) && s.files.isEmpty)
    }

    @Test func readersKeepTheEntryTheyOpenedThroughEvictionReplacementAndRemoval() throws {
        let s = Scratch()
        let n = 6 * Self.block
        let t = try tier(s, capacity: UInt64(n + n / 2))  // one entry at a time
        func rest(_ r: DiskCacheTier.Reader) throws -> [UInt8] {
            var out: [UInt8] = []
            while let chunk = try r.next() { out += chunk }
            return out
        }
        #expect(store(t, "a", "a1", Self.body(1, n)))
        let evicted = try #require(t.open(key: "a"))
        let first = try evicted.next()
        #expect(store(t, "b", "b1", Self.body(2, n)))  // evicts a
        #expect(t.open(key: "a") == nil)
        let replaced = try #require(t.open(key: "b"))
        #expect(store(t, "b", "b2", Self.body(3, n)))  // evicts b1 on its way, then replaces it
        let removed = try #require(t.open(key: "b"))
        t.remove(key: "b")
        #expect(t.open(key: "b") == nil && s.files.isEmpty)
        #expect(try (first ?? []) + rest(evicted) == Self.body(1, n))
        #expect(try rest(replaced) == Self.body(2, n) && String(decoding: replaced.metadata, as: UTF8.self) == "b1")
        #expect(try rest(removed) == Self.body(3, n) && String(decoding: removed.metadata, as: UTF8.self) == "b2")
    }

    @Test func concurrentWritersOfOneKeyLastCommitWinsAndReadersSeeWholeEntries() async throws {
        let s = Scratch()
        let t = try tier(s)
        // Interleaved on one thread: the later commit wins whichever began first.
        let first = try #require(t.beginWrite(key: "k", metadata: Array("1".utf8)))
        let second = try #require(t.beginWrite(key: "k", metadata: Array("2".utf8)))
        first.append(Self.body(1, 3 * Self.block))
        second.append(Self.body(2, 2 * Self.block))
        #expect(second.commit())
        let reader = try #require(t.open(key: "k"))
        #expect(first.commit())
        #expect(try readAll(t, "k")?.body == Self.body(1, 3 * Self.block))
        var held: [UInt8] = []
        while let chunk = try reader.next() { held += chunk }
        #expect(held == Self.body(2, 2 * Self.block))

        // Threads: four writers and four readers on one key, bounded rounds; every read is a
        // whole body matching its metadata's seed.
        let mismatches = Lines()
        let hits = Lines()
        #expect(store(t, "shared", "999", Self.body(999, (1 + 999 % 5) * Self.block + 999)))
        await withTaskGroup(of: Void.self) { group in
            for w in 0..<4 {
                group.addTask {
                    for round in 0..<8 {
                        let seed = w * 100 + round
                        store(t, "shared", "\(seed)", Self.body(seed, (1 + seed % 5) * Self.block + seed), chunk: 3000)
                    }
                }
            }
            for _ in 0..<4 {
                group.addTask {
                    for _ in 0..<40 {
                        guard let got = try? readAll(t, "shared") else { continue }
                        let seed = Int(got.metadata)!
                        hits.sink("hit")
                        if got.body != Self.body(seed, (1 + seed % 5) * Self.block + seed) { mismatches.sink("\(seed)") }
                    }
                }
            }
        }
        #expect(mismatches.all.isEmpty)
        #expect(t.usage.entries == 2 && t.usage.bytes == s.bytesOnDisk)  // k and shared
        #expect(t.index.withLock { $0.writing.isEmpty && $0.cancelled.isEmpty && $0.reservedBytes == 0 })
        #expect(s.files.count == 4, "\(s.files)")
        #expect(!hits.all.isEmpty)
    }

    @Test func updateMetadataReplacesTheRecordAndKeepsTheBody() async throws {
        let s = Scratch()
        do {
            let t = try tier(s)
            #expect(store(t, "k", "short", Self.body(7, 2 * Self.block + 5)))
            #expect(t.updateMetadata(key: "k", Array(String(repeating: "longer head ", count: 50).utf8)))
            #expect(!t.updateMetadata(key: "absent", [1]))
            #expect(try readAll(t, "k")?.metadata.hasPrefix("longer head") == true)
            #expect(t.usage.bytes == s.bytesOnDisk && s.files.count == 2)
            // Racing updates of one entry: one of them wins whole, the byte count stays exact.
            await withTaskGroup(of: Void.self) { group in
                for w in 0..<4 {
                    group.addTask {
                        for i in 0..<10 { t.updateMetadata(key: "k", Array(repeating: UInt8(65 + w), count: 1 + 10 * w + i)) }
                    }
                }
            }
            let raced = try #require(try readAll(t, "k"))
            #expect(Set(raced.metadata.utf8).count == 1)
            #expect(t.usage.bytes == s.bytesOnDisk && s.files.count == 2)
            #expect(t.updateMetadata(key: "k", Array(String(repeating: "longer head ", count: 50).utf8)))
        }
        let t = try tier(s)
        let got = try #require(try readAll(t, "k"))
        #expect(got.metadata.count == 600 && got.body == Self.body(7, 2 * Self.block + 5))
    }

    @Test func openErrorsAreClear() throws {
        let s = Scratch()
        let t = try tier(s)
        #expect(throws: DiskCacheTier.OpenError.inUse(path: s.path)) { try tier(s) }
        _ = t
        close(open(s.path + "/plain", O_CREAT | O_WRONLY, 0o600))
        #expect(throws: DiskCacheTier.OpenError.cannotCreate(path: s.path + "/plain/cache", code: ENOTDIR)) {
            try DiskCacheTier(directory: s.path + "/plain/cache", capacity: 1 << 20, log: { _ in })
        }
        let nested = try DiskCacheTier(directory: s.path + "/x/y", capacity: 1 << 20, log: { _ in })
        #expect(nested.usage.entries == 0)
        _ = consume nested
        rmdir(s.path + "/x/y")
        rmdir(s.path + "/x")
        #expect(
            DiskCacheTier.OpenError.cannotCreate(path: "/p", code: ENOTDIR).description
                == "cannot create the cache directory /p: Not a directory")
    }

    @Test func writeFailuresAreLoggedOncePerEpisode() throws {
        // The directory vanishes under the tier: every write fails (ENOENT), logged once.
        // (ENOSPC and EFBIG through a file-size limit: Tests/e2e/test_disk_tier.py.)
        let s = Scratch()
        let log = Lines()
        let t = try tier(s, log: log)
        #expect(store(t, "kept", "m", Self.body(1, 100)))
        for f in s.files { unlink(s.path + "/" + f) }
        rmdir(s.path)
        for i in 0..<3 { #expect(t.beginWrite(key: "k\(i)", metadata: []) == nil) }
        #expect(log.all.count == 1)
        #expect(log.all.first?.contains("cannot create a body file") == true && log.all.first?.contains("ENOENT") == true)
        mkdir(s.path, 0o700)
    }

    @Test func recordsRoundTripAndForgedOnesAreRefused() {
        let record = DiskEntryRecord(
            key: Array("k".utf8), metadata: [1, 2, 3], bodyLength: 5000, blockSize: 4096,
            generation: 7, trailerDigest: Digest32(of: [9]))
        let bytes = record.encoded()
        #expect(DiskEntryRecord.decode(bytes) == record && record.blockCount == 2 && record.bodyFileSize == 5064)
        #expect(DiskEntryRecord.decode(Array(bytes.dropLast())) == nil && DiskEntryRecord.decode([]) == nil)
        for i in [0, 9, 17, 30, 81, bytes.count - 1] {
            var flipped = bytes
            flipped[i] ^= 1
            #expect(DiskEntryRecord.decode(flipped) == nil, "byte \(i)")
        }
        // Sealed but absurd (only a forger can seal): refused before any size arithmetic.
        var huge = record
        huge.bodyLength = .max
        #expect(DiskEntryRecord.decode(huge.encoded()) == nil)
        var tiny = record
        tiny.blockSize = 1
        #expect(DiskEntryRecord.decode(tiny.encoded()) == nil)
    }

    @Test func lruOrder() {
        var o = LRUOrder<String>()
        for k in ["a", "b", "c", "d"] { o.touch(k) }
        o.touch("b")
        o.remove("c")
        o.touch("e")
        #expect(o.keysOldestFirst == ["a", "d", "b", "e"] && o.oldest == "a" && o.count == 4)
        for k in ["a", "d", "b", "e"] { o.remove(k) }
        #expect(o.oldest == nil && o.count == 0)
        o.touch("z")
        #expect(o.keysOldestFirst == ["z"])
    }

    @Test func generationsAreSixteenHexDigits() {
        #expect(DiskEntryNames.hex16(1) == "0000000000000001")
        #expect(DiskEntryNames.hex16(0xfedc_ba98_7654_3210) == "fedcba9876543210")
        #expect(
            DiskEntryNames.classify("\(String(repeating: "a", count: 64)).\(DiskEntryNames.hex16(42)).body")
                == .body(name: String(repeating: "a", count: 64), generation: 42))
    }
}

import SluiceCore
import Testing

@testable import SluiceServer

/// The tee between a streaming response and the memory tier: chunking, the size limit,
/// exact-size last chunks.
@Suite struct CacheFillTests {
    let head = CacheStoredResponse(status: 200, fields: [("Cache-Control", "max-age=60")], requestTime: 0, responseTime: 0)

    func feed(_ fill: CacheFill, _ bytes: [UInt8], blocks: Int) {
        let step = max(1, bytes.count / blocks)
        var i = 0
        while i < bytes.count {
            let end = min(bytes.count, i + step)
            bytes[i..<end].withUnsafeBytes { fill.append($0) }
            i = end
        }
    }

    @Test func knownLengthIsOneExactChunk() {
        let store = CacheStore(.init(memory: 1 << 20, maxObjectSize: 1 << 20))
        let body = (0..<5000).map { UInt8(truncatingIfNeeded: $0) }
        let fill = CacheFill(store: store, url: "u", response: head, contentLength: 5000)
        feed(fill, body, blocks: 7)
        #expect(fill.complete() == 0)
        let object = store.memory.variants(for: "u")[0]
        #expect(object.chunks.map(\.count) == [5000] && object.bodyLength == 5000)
        #expect(Array(object.chunks[0].bytes) == body)
    }

    @Test func unknownLengthChunksAndExactLastChunk() {
        let store = CacheStore(.init(memory: 4 << 20, maxObjectSize: 4 << 20))
        let body = (0..<(CacheFill.unknownLengthChunk * 2 + 100)).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        let fill = CacheFill(store: store, url: "u", response: head, contentLength: nil)
        feed(fill, body, blocks: 13)
        #expect(fill.complete() == 0)
        let object = store.memory.variants(for: "u")[0]
        #expect(object.chunks.map(\.count) == [CacheFill.unknownLengthChunk, CacheFill.unknownLengthChunk, 100])
        #expect(object.chunks.flatMap { Array($0.bytes) } == body)
    }

    @Test func pastTheLimitNothingIsStored() {
        let store = CacheStore(.init(memory: 1 << 20, maxObjectSize: 1000))
        let fill = CacheFill(store: store, url: "u", response: head, contentLength: nil)
        feed(fill, [UInt8](repeating: 1, count: 1001), blocks: 3)
        #expect(fill.abandoned && fill.complete() == nil)
        #expect(store.memory.variants(for: "u").isEmpty)
    }

    func diskTier(_ scratch: DiskCacheTierTests.Scratch) throws -> DiskCacheTier {
        try DiskCacheTier(directory: scratch.path, capacity: 64 << 20, blockSize: 4096) { _ in }
    }

    func diskBody(_ tier: DiskCacheTier, _ url: String) -> (CacheStoredResponse?, [UInt8]) {
        guard let reader = tier.open(key: url) else { return (nil, []) }
        var body: [UInt8] = []
        while let block = try? reader.next() { body += block }
        return (CacheStoredResponse(bytes: reader.metadata), body)
    }

    @Test func withADiskTierEveryBodyIsOnDiskAndSmallOnesInMemoryToo() throws {
        let scratch = DiskCacheTierTests.Scratch()
        defer { withExtendedLifetime(scratch) {} }
        let tier = try diskTier(scratch)
        // memory 1 MiB with a disk tier: bodies up to 128 KiB are also kept in memory.
        let store = CacheStore(.init(memory: 1 << 20, maxObjectSize: 8 << 20, disk: .init(path: tier.directory, size: 64 << 20)))
        let body = (0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let unknown = CacheFill(store: store, disk: tier, url: "u", response: head, contentLength: nil)
        feed(unknown, body, blocks: 11)
        #expect(unknown.complete() == 0 && unknown.storedOnDisk && !unknown.storedInMemory)
        #expect(store.memory.variants(for: "u").isEmpty && store.memory.stats.filling == 0)
        let (meta, stored) = diskBody(tier, "u")
        #expect(meta?.status == 200 && stored == body)
        // A small body goes to both tiers.
        let small = CacheFill(store: store, disk: tier, url: "u", response: head, contentLength: 10)
        feed(small, Array(body[0..<10]), blocks: 1)
        #expect(small.complete() == 0 && small.storedOnDisk && small.storedInMemory)
        #expect(store.memory.variants(for: "u").count == 1 && diskBody(tier, "u").1 == Array(body[0..<10]))
        // A declared length over the share goes to disk only and drops the outdated memory copy.
        let known = CacheFill(store: store, disk: tier, url: "u", response: head, contentLength: Int64(body.count))
        feed(known, body, blocks: 3)
        #expect(known.complete() == 0 && known.storedOnDisk && store.memory.variants(for: "u").isEmpty)
        #expect(diskBody(tier, "u").1 == body)
        #expect(store.memory.stats.filling == 0 && tier.usage.entries == 1)
    }

    @Test func varyVariantsAreSeparateDiskEntries() throws {
        let scratch = DiskCacheTierTests.Scratch()
        defer { withExtendedLifetime(scratch) {} }
        let tier = try diskTier(scratch)
        let store = CacheStore(.init(memory: 1 << 20, maxObjectSize: 8 << 20, disk: .init(path: tier.directory, size: 64 << 20)))
        for (i, language) in ["en", "fr", "de"].enumerated() {
            let response = CacheStoredResponse(
                status: 200, fields: [("Cache-Control", "max-age=60"), ("Vary", "Accept-Language")],
                requestFields: [("Accept-Language", language)], requestTime: 0, responseTime: 0)
            let fill = CacheFill(store: store, disk: tier, url: "u", response: response, contentLength: 3)
            feed(fill, [UInt8(i), 1, 2], blocks: 1)
            #expect(fill.complete() != nil && fill.storedOnDisk)
        }
        #expect(Set(tier.variants(of: "u")) == ["accept-language=en", "accept-language=fr", "accept-language=de"])
        #expect(store.memory.variants(for: "u").count == 3)
        guard let reader = tier.open(key: "u", variant: "accept-language=fr") else {
            Issue.record("the fr variant is not on disk")
            return
        }
        #expect(try reader.next() == [1, 1, 2])
        #expect(CacheStoredResponse(bytes: reader.metadata)?.varyMatches([("Accept-Language", "fr")]) == true)
        tier.remove(key: "u")  // an invalidation takes every variant
        #expect(tier.variants(of: "u").isEmpty && tier.usage.entries == 0)
    }

    @Test func memoryCopyCountsAgainstTheTierWhileItFills() {
        let store = CacheStore(.init(memory: 1 << 20, maxObjectSize: 1 << 20))
        let fill = CacheFill(store: store, url: "u", response: head, contentLength: 600_000)
        feed(fill, [UInt8](repeating: 3, count: 300_000), blocks: 3)
        #expect(store.memory.stats.filling == 600_000)  // the chunk the declared length sized
        // An object that cannot fit beside the fill is not stored; the fill's bytes are kept.
        let other = CacheObject(response: head, chunks: [CacheChunk([UInt8](repeating: 1, count: 500_000))])
        #expect(store.memory.insert(other, for: "v") == nil)
        feed(fill, [UInt8](repeating: 3, count: 300_000), blocks: 3)
        #expect(fill.complete() == 0)
        #expect(store.memory.stats.filling == 0 && store.memory.stats.bytes > 600_000)
    }

    @Test func diskFillPastTheLimitIsAbandonedWithoutAnEntry() throws {
        let scratch = DiskCacheTierTests.Scratch()
        defer { withExtendedLifetime(scratch) {} }
        let tier = try diskTier(scratch)
        let store = CacheStore(.init(memory: 1 << 20, maxObjectSize: 200_000, disk: .init(path: tier.directory, size: 64 << 20)))
        let fill = CacheFill(store: store, disk: tier, url: "u", response: head, contentLength: nil)
        feed(fill, [UInt8](repeating: 1, count: 200_001), blocks: 5)
        #expect(fill.abandoned && fill.complete() == nil)
        #expect(tier.open(key: "u") == nil && tier.usage.entries == 0 && tier.usage.bytes == 0)
    }

    @Test func aBodyShorterThanItsDeclaredLengthIsNotStored() {
        let store = CacheStore(.init(memory: 4 << 20, maxObjectSize: 4 << 20))
        let fill = CacheFill(store: store, url: "u", response: head, contentLength: 10)
        feed(fill, [1, 2, 3, 4, 5], blocks: 1)
        #expect(fill.complete() == nil && store.memory.variants(for: "u").isEmpty && store.memory.stats.filling == 0)
    }

    @Test func aDroppedMemoryCopyGivesItsReservationBack() throws {
        let scratch = DiskCacheTierTests.Scratch()
        defer { withExtendedLifetime(scratch) {} }
        let tier = try diskTier(scratch)
        let store = CacheStore(.init(memory: 1 << 20, maxObjectSize: 8 << 20, disk: .init(path: tier.directory, size: 64 << 20)))
        let fill = CacheFill(store: store, disk: tier, url: "u", response: head, contentLength: nil)
        feed(fill, [UInt8](repeating: 4, count: 100_000), blocks: 2)
        #expect(store.memory.stats.filling > 0)
        // Past the share (128 KiB) the body goes on to disk only: memory holds nothing for it.
        feed(fill, [UInt8](repeating: 4, count: 100_000), blocks: 2)
        #expect(store.memory.stats.filling == 0)
        #expect(fill.complete() == 0 && fill.storedOnDisk && !fill.storedInMemory)
    }

    @Test func aStoredCopyCancelsAPromotionOfTheOlderOne() {
        let store = CacheStore(.init(memory: 1 << 20, maxObjectSize: 1 << 20))
        let promotion = store.memory.beginFill("u", promotion: true)
        let fill = CacheFill(store: store, url: "u", response: head, contentLength: 3)
        feed(fill, [7, 8, 9], blocks: 1)
        #expect(fill.complete() == 0)
        // The newer copy was stored, then evicted: the older promotion must not come back.
        let large = CacheObject(response: head, chunks: [CacheChunk([UInt8](repeating: 0, count: 1_048_193))])
        #expect(store.memory.insert(large, for: "w") == 1 && store.memory.variants(for: "u").isEmpty)
        let older = CacheObject(response: head, chunks: [CacheChunk([1, 2, 3])])
        #expect(store.memory.insert(older, for: "u", fill: promotion, ifAbsent: true) == nil)
        #expect(store.memory.variants(for: "u").isEmpty)
    }

    @Test func aBodyOverrunningItsDeclaredLengthIsNotStored() {
        let store = CacheStore(.init(memory: 4 << 20, maxObjectSize: 4 << 20))
        let fill = CacheFill(store: store, url: "u", response: head, contentLength: 1)
        feed(fill, [UInt8](repeating: 2, count: 300_000), blocks: 20)
        #expect(fill.abandoned && fill.complete() == nil)
        #expect(store.memory.variants(for: "u").isEmpty)
    }

    @Test func anInvalidationDuringTheFillCancelsIt() {
        let store = CacheStore(.init(memory: 1 << 20, maxObjectSize: 1 << 20))
        let fill = CacheFill(store: store, url: "u", response: head, contentLength: 3)
        feed(fill, [1, 2, 3], blocks: 1)
        store.memory.invalidate("u")  // an unsafe method's success while the old body streamed
        #expect(fill.complete() == nil)
        #expect(store.memory.variants(for: "u").isEmpty)
        let next = CacheFill(store: store, url: "u", response: head, contentLength: 3, trustGeneration: 7)
        feed(next, [4, 5, 6], blocks: 1)
        #expect(next.complete() == 0 && store.memory.variants(for: "u").first?.trustGeneration == 7)
    }
}

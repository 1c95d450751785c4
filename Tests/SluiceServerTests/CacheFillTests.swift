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
}

import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

extension DiskCacheTier {
    /// One open entry: its metadata and body length at once, the body block by block through
    /// `next()`, each block checked against its digest before it is returned. Reads from the
    /// descriptor opened with the entry, so it keeps working after the entry is evicted,
    /// removed or replaced (the file's space is freed when the reader goes).
    ///
    /// Threading: belongs to the thread that serves the hit (not `Sendable`); each `next()`
    /// reads and hashes one block.
    public final class Reader {
        let tier: DiskCacheTier
        /// The entry's file name stem and its body's generation (`CacheObject.DiskEntry`).
        public let name: String
        public let generation: UInt64
        private let trailer: [UInt8]
        let blockSize: Int
        /// The body file, open for as long as the reader lives (a kernel send's file segment
        /// keeps the reader alive until its bytes are sent: `DiskHitStream`).
        let fd: Int32
        private var block = 0
        let blocks: Int
        private var buffer: [UInt8] = []
        /// The tier's record of the blocks verified when the entry was opened, plus what this
        /// reader verified for the kernel since (`DiskCacheTier+KernelSend`).
        var verified: DiskBlockVerification?

        public let metadata: [UInt8]
        public let bodyLength: UInt64
        /// What the caller attached to the entry's record as its decoding of `metadata`
        /// (`attachDecoded`), if the tier kept one: nil at the first open of the record.
        public let decoded: (any Sendable)?
        /// The record file's identity, when the tier keeps the record (`DiskDecodedRecords`).
        private let keptAt: DiskFileIdentity?

        init(
            tier: DiskCacheTier, name: String, _ kept: DiskDecodedRecords.Record, keptAt: DiskFileIdentity?,
            fd: Int32, verified: DiskBlockVerification? = nil
        ) {
            self.tier = tier
            self.name = name
            generation = kept.record.generation
            trailer = kept.trailer
            blockSize = Int(kept.record.blockSize)
            self.fd = fd
            blocks = kept.record.blockCount
            metadata = kept.record.metadata
            bodyLength = kept.record.bodyLength
            decoded = kept.decoded
            self.keptAt = keptAt
            self.verified = verified
        }

        /// Keeps `value`, the caller's decoding of `metadata`, with the tier's copy of the
        /// record, so that the next open of the unchanged record has it in `decoded`.
        public func attachDecoded(_ value: any Sendable) {
            guard let keptAt else { return }
            tier.index.withLock { $0.decoded.attach(name, identity: keptAt, value) }
        }

        deinit {
            close(fd)
        }

        /// Moves to the block holding body byte `offset` (a `Range` request skips the blocks
        /// before it unread) and returns that block's first byte's offset. Only forward.
        public func seek(toBlockContaining offset: UInt64) -> UInt64 {
            let target = min(blocks, Int(offset / UInt64(blockSize)))
            if target > block { block = target }
            return UInt64(block) * UInt64(blockSize)
        }

        /// The next block of the body, nil after the last. Throws `CorruptEntry` (and drops
        /// the entry) for a block that cannot be read whole or fails its digest.
        public func next() throws(CorruptEntry) -> [UInt8]? {
            try withNextBlock { Array($0) }
        }

        /// Calls `body` with the next block of the body, read into the reader's own buffer (no
        /// allocation per block; the bytes are valid only during the call), and returns what it
        /// returns; nil after the last block. Throws like `next()`.
        public func withNextBlock<R>(_ body: (UnsafeRawBufferPointer) -> R) throws(CorruptEntry) -> R? {
            guard block < blocks else { return nil }
            var result: R?
            guard read(block, { result = body($0) }) else {
                let failed = block
                block = blocks
                throw corrupt(at: failed)
            }
            block += 1
            if block == blocks { buffer = [] }
            return result
        }

        /// Reads body block `index` into the reader's buffer and checks it against its digest;
        /// calls `body` with it only if it matches. False for a block that cannot be read whole
        /// or does not match.
        func read(_ index: Int, _ body: (UnsafeRawBufferPointer) -> Void) -> Bool {
            let offset = UInt64(index) * UInt64(blockSize)
            let count = Int(min(UInt64(blockSize), bodyLength - offset))
            if buffer.count < count { buffer = [UInt8](repeating: 0, count: count) }
            let at = index * Digest32.size
            return buffer.withUnsafeMutableBytes { whole -> Bool in
                let data = UnsafeMutableRawBufferPointer(rebasing: whole[0..<count])
                guard DiskFile.preadAll(fd, into: data, offset: offset) else { return false }
                let bytes = UnsafeRawBufferPointer(data)
                let matches = trailer.withUnsafeBytes {
                    Digest32.matches(bytes, expected: UnsafeRawBufferPointer(rebasing: $0[at..<at + Digest32.size]))
                }
                if matches { body(bytes) }
                return matches
            }
        }

        /// Block `index` failed: the entry is dropped and the reader gives nothing more.
        func corrupt(at index: Int) -> CorruptEntry {
            buffer = []
            tier.drop(name: name, generation: generation)
            return CorruptEntry(block: index)
        }
    }
}

extension Digest32 {
    /// Whether `data` hashes to the 32 bytes at `expected`.
    static func matches(_ data: UnsafeRawBufferPointer, expected: UnsafeRawBufferPointer) -> Bool {
        var md = (UInt64(0), UInt64(0), UInt64(0), UInt64(0))
        return withUnsafeMutableBytes(of: &md) { out -> Bool in
            Crypto.sha256(data, into: out.baseAddress!)
            return memcmp(expected.baseAddress!, out.baseAddress!, size) == 0
        }
    }
}

import COpenSSL

#if canImport(Glibc)
    import Glibc
#endif

extension DiskCacheTier {
    /// One body being stored: `append` its chunks in order, then `commit()` or `abort()`.
    /// Each chunk is counted against the tier's capacity (evicting as needed), written straight
    /// to the body's temporary file (no copy, no buffer: a writer holds a hash context and its
    /// block digests, 32 bytes per block, not a block of data) and hashed into its block's
    /// SHA-256. Any failure ends the writer: later calls return false, the temporary is gone,
    /// and nothing of it is ever visible. A writer dropped without `commit()` aborts.
    ///
    /// Threading: belongs to the worker thread that streams the body (not `Sendable`); each
    /// `append` blocks for one `write` of its chunk (two if it ends a block) and its hash.
    /// The OpenSSL digest context is the writer's own, freed in `deinit`.
    public final class Writer {
        private enum State { case open, failed, committed }

        private let tier: DiskCacheTier
        /// The entry's file name stem and this body's generation (`CacheObject.DiskEntry`).
        public let name: String
        private let key: String
        private let variant: String
        private let fullKey: [UInt8]
        private let metadata: [UInt8]
        public let generation: UInt64
        private var fd: Int32
        private var state = State.open
        /// The SHA-256 of the block being written (`EVP_MD_CTX`, owned).
        private let hash: OpaquePointer
        private var blockFill = 0
        private var digests: [UInt8] = []
        private var length: UInt64 = 0
        private var reserved: UInt64 = 0

        /// Body bytes appended so far.
        public var bodyLength: UInt64 { length }
        /// The temporary body file's name in the tier's directory (until the commit renames it).
        var temporaryName: String { DiskEntryNames.bodyTemporary(name, generation) }

        init(
            tier: DiskCacheTier, name: String, key: String, variant: String, fullKey: [UInt8], metadata: [UInt8],
            generation: UInt64, fd: Int32
        ) {
            self.tier = tier
            self.name = name
            self.key = key
            self.variant = variant
            self.fullKey = fullKey
            self.metadata = metadata
            self.generation = generation
            self.fd = fd
            hash = EVP_MD_CTX_new()!
            EVP_DigestInit_ex(hash, EVP_sha256(), nil)
        }

        deinit {
            if state == .open { abort() }
            EVP_MD_CTX_free(hash)
        }

        /// Appends the next chunk of the body; false once the writer has failed (a write error,
        /// or the body cannot fit in the tier's capacity): stop teeing and drop the writer.
        @discardableResult
        public func append(_ chunk: UnsafeRawBufferPointer) -> Bool {
            guard state == .open else { return false }
            var rest = chunk
            while !rest.isEmpty {
                let take = min(rest.count, tier.blockSize - blockFill)
                let piece = UnsafeRawBufferPointer(rebasing: rest[rest.startIndex..<rest.startIndex + take])
                // A block's first byte also reserves the block's digest in the trailer.
                guard reserveOrFail(UInt64(take + (blockFill == 0 ? Digest32.size : 0))) else { return false }
                EVP_DigestUpdate(hash, piece.baseAddress, take)
                if let code = DiskFile.writeAll(fd, piece) { return fail(code, "write a body file") }
                blockFill += take
                length += UInt64(take)
                if blockFill == tier.blockSize { endBlock() }
                rest = UnsafeRawBufferPointer(rebasing: rest[(rest.startIndex + take)...])
            }
            return true
        }

        @discardableResult
        public func append(_ chunk: [UInt8]) -> Bool {
            chunk.withUnsafeBytes { append($0) }
        }

        /// Makes the entry visible (replacing any entry of the same key). False if the writer
        /// had failed, the final writes fail, or the key was removed while it wrote; the writer
        /// is finished either way.
        @discardableResult
        public func commit() -> Bool {
            guard state == .open else { return false }
            if blockFill > 0 { endBlock() }
            if let code = digests.withUnsafeBytes({ DiskFile.writeAll(fd, $0) }) { return fail(code, "write a body file") }
            let closed = close(fd)
            fd = -1
            if closed != 0 { return fail(errno, "write a body file") }
            let body = DiskEntryNames.body(name, generation)
            guard renameat(tier.directoryFD, DiskEntryNames.bodyTemporary(name, generation), tier.directoryFD, body) == 0 else {
                return fail(errno, "rename a body file")
            }
            let record = DiskEntryRecord(
                key: fullKey, metadata: metadata, bodyLength: length, blockSize: UInt32(tier.blockSize),
                generation: generation, trailerDigest: Digest32(of: digests)
            ).encoded()
            guard reserveOrFail(UInt64(record.count), body: body) else { return false }
            let temporary = DiskEntryNames.recordTemporary(name, generation)
            if let code = DiskFile.create(tier.directoryFD, temporary, record) {
                return fail(code, "write a record", body: body)
            }
            let size = reserved
            var renameError: Int32 = 0
            enum Outcome {
                case committed(replaced: UInt64?, evicted: [String], recovered: String?)
                case cancelled, failed
            }
            let outcome = tier.index.withLock { index -> Outcome in
                guard !index.cancelled.contains(generation) else { return .cancelled }
                guard renameat(tier.directoryFD, temporary, tier.directoryFD, DiskEntryNames.record(name)) == 0 else {
                    renameError = errno
                    return .failed
                }
                let replaced = index.take(name)
                index.insert(
                    name,
                    Entry(generation: generation, bytes: size, recordBytes: UInt64(record.count), key: key, variant: variant))
                index.committedBytes += size
                index.reservedBytes -= size
                DiskCacheTier.forgetWriteLocked(key, generation, &index)
                // Past `maxVariants`, the key's least recently used other variant goes.
                var evicted: [String] = []
                while let group = index.groups[key], group.count > DiskCacheTier.maxVariants,
                    let victim = group.values.filter({ $0 != name }).min(by: {
                        index.entries[$0]!.lastUse < index.entries[$1]!.lastUse
                    }),
                    let entry = tier.removeLocked(victim, &index)
                {
                    evicted.append(DiskEntryNames.body(victim, entry.generation))
                }
                return .committed(replaced: replaced?.generation, evicted: evicted, recovered: tier.recoveredLocked(&index))
            }
            guard case .committed(let replaced, let evicted, let recovered) = outcome else {
                unlinkat(tier.directoryFD, temporary, 0)
                if case .failed = outcome { return fail(renameError, "rename a record", body: body) }
                finish(body: body)
                return false
            }
            reserved = 0
            state = .committed
            if let replaced, replaced != generation {
                unlinkat(tier.directoryFD, DiskEntryNames.body(name, replaced), 0)
            }
            for body in evicted { unlinkat(tier.directoryFD, body, 0) }
            if let recovered { tier.log(recovered) }
            return true
        }

        /// Discards the body: nothing of it becomes visible.
        public func abort() {
            guard state == .open else { return }
            finish(body: nil)
        }

        private func endBlock() {
            var md = [UInt8](repeating: 0, count: Digest32.size)
            EVP_DigestFinal_ex(hash, &md, nil)
            digests += md
            EVP_DigestInit_ex(hash, EVP_sha256(), nil)
            blockFill = 0
        }

        /// Reserves capacity; a body that cannot fit ends the writer (not a failure episode:
        /// the disk is fine, the object is too large for the tier as configured).
        private func reserveOrFail(_ bytes: UInt64, body: String? = nil) -> Bool {
            guard tier.reserve(bytes) else {
                finish(body: body)
                return false
            }
            reserved += bytes
            return true
        }

        private func fail(_ code: Int32, _ operation: String, body: String? = nil) -> Bool {
            tier.writeFailed(code: code, operation: operation)
            finish(body: body)
            return false
        }

        /// Ends an uncommitted writer: closes and removes its files, releases its reservation.
        private func finish(body: String?) {
            state = .failed
            if fd >= 0 {
                close(fd)
                fd = -1
            }
            unlinkat(tier.directoryFD, DiskEntryNames.bodyTemporary(name, generation), 0)
            if let body { unlinkat(tier.directoryFD, body, 0) }
            tier.writeEnded(key: key, generation: generation, reserved: reserved)
            reserved = 0
            digests = []
        }
    }
}

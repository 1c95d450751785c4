#if canImport(Glibc)
import Glibc
#endif

extension DiskCacheTier {
    /// One body being stored: `append` its chunks in order, then `commit()` or `abort()`.
    /// Bytes are gathered into blocks of the tier's `blockSize`; each full block is hashed,
    /// counted against the tier's capacity (evicting as needed) and written to the body's
    /// temporary file. Any failure ends the writer: later calls return false, the temporary is
    /// gone, and nothing of it is ever visible. A writer dropped without `commit()` aborts.
    ///
    /// Threading: belongs to the worker thread that streams the body (not `Sendable`); each
    /// `append` blocks at most for the block writes its chunk completes (see the tier's note).
    public final class Writer {
        private enum State { case open, failed, committed }

        private let tier: DiskCacheTier
        private let name: String
        private let key: [UInt8]
        private let metadata: [UInt8]
        private let generation: UInt64
        private var fd: Int32
        private var state = State.open
        private var buffer: [UInt8]
        private var digests: [UInt8] = []
        private var length: UInt64 = 0
        private var reserved: UInt64 = 0

        /// Body bytes appended so far.
        public var bodyLength: UInt64 { length }

        init(tier: DiskCacheTier, name: String, key: [UInt8], metadata: [UInt8], generation: UInt64, fd: Int32) {
            self.tier = tier
            self.name = name
            self.key = key
            self.metadata = metadata
            self.generation = generation
            self.fd = fd
            buffer = []
            buffer.reserveCapacity(tier.blockSize)
        }

        deinit {
            if state == .open { abort() }
        }

        /// Appends the next chunk of the body; false once the writer has failed (a write error,
        /// or the body cannot fit in the tier's capacity): stop teeing and drop the writer.
        @discardableResult
        public func append(_ chunk: UnsafeRawBufferPointer) -> Bool {
            guard state == .open else { return false }
            var rest = chunk
            while !rest.isEmpty {
                let take = min(rest.count, tier.blockSize - buffer.count)
                buffer.append(contentsOf: rest[rest.startIndex..<rest.startIndex + take])
                rest = UnsafeRawBufferPointer(rebasing: rest[(rest.startIndex + take)...])
                length += UInt64(take)
                if buffer.count == tier.blockSize, !flushBlock() { return false }
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
            if !buffer.isEmpty, !flushBlock() { return false }
            if let code = digests.withUnsafeBytes({ DiskFile.writeAll(fd, $0) }) { return fail(code, "write a body file") }
            let closed = close(fd)
            fd = -1
            if closed != 0 { return fail(errno, "write a body file") }
            let body = DiskEntryNames.body(name, generation)
            guard renameat(tier.directoryFD, DiskEntryNames.bodyTemporary(name, generation), tier.directoryFD, body) == 0 else {
                return fail(errno, "rename a body file")
            }
            let record = DiskEntryRecord(key: key, metadata: metadata, bodyLength: length, blockSize: UInt32(tier.blockSize),
                                         generation: generation, trailerDigest: Digest32(of: digests)).encoded()
            guard reserveOrFail(UInt64(record.count), body: body) else { return false }
            let temporary = DiskEntryNames.recordTemporary(name, generation)
            if let code = DiskFile.create(tier.directoryFD, temporary, record) {
                return fail(code, "write a record", body: body)
            }
            let size = reserved
            var renameError: Int32 = 0
            enum Outcome { case committed(replaced: UInt64?, recovered: String?), cancelled, failed }
            let outcome = tier.index.withLock { index -> Outcome in
                guard !index.cancelled.contains(generation) else { return .cancelled }
                guard renameat(tier.directoryFD, temporary, tier.directoryFD, DiskEntryNames.record(name)) == 0 else {
                    renameError = errno
                    return .failed
                }
                let replaced = index.entries[name]
                if let replaced { index.committedBytes -= replaced.bytes }
                index.entries[name] = Entry(generation: generation, bytes: size, recordBytes: UInt64(record.count))
                index.order.touch(name)
                index.committedBytes += size
                index.reservedBytes -= size
                DiskCacheTier.forgetWriteLocked(name, generation, &index)
                return .committed(replaced: replaced?.generation, recovered: tier.recoveredLocked(&index))
            }
            guard case .committed(let replaced, let recovered) = outcome else {
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
            if let recovered { tier.log(recovered) }
            return true
        }

        /// Discards the body: nothing of it becomes visible.
        public func abort() {
            guard state == .open else { return }
            finish(body: nil)
        }

        private func flushBlock() -> Bool {
            guard reserveOrFail(UInt64(buffer.count + Digest32.size)) else { return false }
            let failure = buffer.withUnsafeBytes { block -> Int32? in
                digests += Digest32(of: block).bytes
                return DiskFile.writeAll(fd, block)
            }
            buffer.removeAll(keepingCapacity: true)
            if let failure { return fail(failure, "write a body file") }
            return true
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
            tier.writeEnded(name: name, generation: generation, reserved: reserved)
            reserved = 0
            buffer = []
            digests = []
        }
    }
}

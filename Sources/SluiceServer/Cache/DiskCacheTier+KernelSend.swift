#if canImport(Glibc)
    import Glibc
#endif

/// A disk hit the kernel sends (`sendfile` from the body file to the client's socket,
/// `DiskHitStream`) never passes through user space, so its blocks cannot be hashed as they
/// go. Instead each block is verified once — read and hashed like a block of the read path —
/// the first time this process sends it, and again only when the body file's identity
/// (`DiskFileIdentity`: device, inode, size, mtime, ctime) is no longer the one it was
/// verified at. The identity is taken with `fstat` before every slice is queued; the tier
/// remembers per entry which blocks were verified at which identity (`Entry.verified`,
/// dropped with the entry), so later hits, by any worker, skip them.
///
/// A file whose last change is less than `DiskFileIdentity.settleSeconds` old is verified but
/// not remembered: its ctime could still be repeated by a write in the same clock tick.
///
/// Threading: a reader's calls run on the thread that owns it; the tier's record is updated
/// under its index lock, once per slice that verified new blocks (never on a hit whose blocks
/// are all known).
extension DiskCacheTier.Reader {
    /// Makes body bytes `range` safe for the kernel to send from `fd`: the file must still be
    /// the size its record says, and every block overlapping `range` that was not verified at
    /// the file's current identity is read and checked now. Throws `CorruptEntry` (and drops
    /// the entry) for a block that fails, or for a file that is not the size it should be.
    func prepareKernelSend(_ range: Range<Int>) throws(DiskCacheTier.CorruptEntry) {
        guard !range.isEmpty else { return }
        let first = range.lowerBound / blockSize
        let last = (range.upperBound - 1) / blockSize
        guard let identity = DiskFileIdentity.of(fd), UInt64(identity.size) == expectedFileSize else {
            throw corrupt(at: first)
        }
        var settled: Bool?  // asked only when a block is read (a hit whose blocks are known reads no clock)
        var checked = 0
        var learned = false
        for index in first...last where verified?.contains(index, at: identity) != true {
            guard read(index, { checked += $0.count }) else { throw corrupt(at: index) }
            if settled == nil { settled = identity.isSettled(now: DiskFileIdentity.now()) }
            if settled == true {
                if verified == nil { verified = DiskBlockVerification(identity: identity) }
                verified!.insert(index, at: identity)
                learned = true
            }
        }
        if checked > 0 { tier.verifiedBytes.add(UInt64(checked), ordering: .relaxed) }
        if learned, let verified { tier.recordVerified(name: name, generation: generation, verified) }
    }

    /// The body file's size: the body and its trailer of block digests.
    private var expectedFileSize: UInt64 {
        bodyLength + UInt64(blocks * Digest32.size)
    }
}

extension DiskCacheTier {
    /// Adds a reader's verified blocks to its entry's record, unless the entry is gone or a
    /// newer commit replaced it (the record is the entry's, never carried to another body).
    func recordVerified(name: String, generation: UInt64, _ verified: DiskBlockVerification) {
        index.withLock { index in
            guard index.entries[name]?.generation == generation else { return }
            if index.entries[name]!.verified == nil {
                index.entries[name]!.verified = verified
            } else {
                index.entries[name]!.verified!.merge(verified)
            }
        }
    }

    /// Body bytes queued for the kernel to send (`DiskHitStream`).
    func countKernelSend(_ bytes: Int) {
        sendfileBytes.add(UInt64(bytes), ordering: .relaxed)
    }
}

import SluiceCore
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// The response cache's disk tier: entries of opaque bytes (a key, the cache's metadata and a
/// streamed body) kept in one directory, bounded in size with least-recently-used eviction,
/// surviving restarts and `kill -9` at any moment without ever serving a torn or mixed entry.
/// It knows nothing of HTTP: the cache above it (RFC 9111 rules, memory tier) decides what to
/// store and serializes its response head into `metadata`.
///
/// API (a `key` may have several entries, one per `variant` string — the cache's `Vary`
/// variants of a URL; the default variant is `""`):
/// - `beginWrite(key:variant:metadata:)` → `Writer`; `append` the body as it streams, then `commit()`
///   (the entry becomes visible atomically, replacing any older one: last commit wins) or
///   `abort()` (nothing becomes visible; also what dropping an uncommitted writer does).
/// - `variants(of:)` lists a key's variants; `open(key:variant:)` → `Reader` with `metadata`, `bodyLength` and `next()` (or, without an
///   allocation per block, `withNextBlock`) giving the body in blocks, each verified before
///   it is returned; or `prepareKernelSend(_:)` before the kernel sends a byte range straight
///   from the reader's descriptor (`DiskCacheTier+KernelSend`). A reader opened before an eviction, removal
///   or replacement keeps reading the entry it opened (open descriptor, unlinked file).
/// - `updateMetadata(key:variant:_:)` replaces the metadata in place (a 304's updated head);
///   `remove` invalidates every variant of the key and the key's writes in progress (their
///   commit fails); `usage` reports entries and bytes.
///
/// Variants: an entry's full key is `key`, or `key` NUL `variant` (neither contains NUL), and
/// its files are named after that full key. A key keeps at most `maxVariants` (8) entries: a
/// commit beyond that evicts the key's least recently used variant, so a `Vary: User-Agent`
/// URL cannot fill the tier with one URL's copies or make a lookup open hundreds of files.
///
/// Files (all little-endian; `N` = SHA-256 of the key in hex, `G` = a random 64-bit generation
/// per write, 16 hex digits):
/// - `N.G.body`: the body, then its trailer — one SHA-256 per `blockSize` block of the body.
/// - `N.meta`, the entry's record: magic `SLDCMETA`, version u32 (1), flags u32 (0), key length
///   u32, metadata length u32, body length u64, block size u32, reserved u32, generation u64
///   (names the body file), SHA-256 of the body file's trailer (32), the key, the metadata,
///   then SHA-256 of all the preceding bytes (32).
/// - `*.tmp`: writes in progress, removed at start.
///
/// Commit protocol: the body is written to `N.G.body.tmp`, its trailer appended, renamed to
/// `N.G.body`; the record is written to `N.G.meta.tmp` and renamed over `N.meta` under the
/// index lock, then the replaced body file is unlinked. A record therefore only ever names a
/// complete body file. A crash between the steps leaves temporaries or a body no record names:
/// the start-up scan removes both.
///
/// Durability (fsync policy): no fsync. `kill -9` does not lose the page cache, so at any kill
/// the directory holds whole committed entries and garbage the scan removes. Power loss or a
/// kernel crash can lose recent entries or leave their files torn (the record renamed before
/// its data reached the disk); the checksums catch that — a record that fails its seal or
/// names a body of the wrong size is dropped by the scan, a block that fails its digest is
/// never returned — so an entry is lost, never served wrong. Caching does not need more.
///
/// Verification cost: the record (key + metadata + digests, a few KiB) is sealed and checked,
/// and the trailer checked against it, at the first open in this process and again whenever
/// the record file's identity changes (`DiskDecodedRecords`: a kept record costs one `fstatat`
/// per open, the body file one `fstat`); every block is hashed as it is read (SHA-256 with
/// SHA-NI: ~1.5 GB/s, about the cost of the read itself).
/// A block the kernel sends is hashed the first time this process sends it and again only
/// after its file's identity changes (`DiskBlockVerification`, kept per entry in the index).
/// Nothing is read twice and there is no up-front pass over a large body; the price is that
/// a body corrupted on disk after its first block is found only when that block is reached:
/// `next()` then throws `CorruptEntry`, the entry is dropped, and the caller, which has sent a
/// prefix, must abort the response (never complete it). The same on-disk corruption within
/// the first block or the record is a plain miss.
///
/// Size: `capacity` bounds the record and body files (bodies with their trailers), counting
/// bytes of writes in progress as they are written; a write that would exceed it evicts the
/// least recently used entries (opened or committed), and fails if it cannot fit even in an
/// empty tier. Space held by a reader of an evicted entry is released when it closes. Access
/// order does not survive a restart: the scan orders entries by their record's mtime.
///
/// Failures: a write that fails (`ENOSPC`, `EDQUOT`, `EACCES`, `EROFS`, `EIO`, ...) ends the
/// writer cleanly (`append`/`commit` return false, temporaries removed); the first failure of
/// an episode is logged through `log`, later ones only counted, and the first commit that
/// succeeds again logs the recovery. A directory that cannot be created or opened, or that
/// another process holds (an exclusive `flock` on it), is an `OpenError` from `init`.
///
/// Threading: one tier is shared by every worker. The index (entries, LRU order, byte counts,
/// failure episode) is a `Mutex`; it is held only for index updates and for the cheap file
/// operations that must be atomic with them (opening an entry's files, `fstatat` of its
/// record, renaming or unlinking a record). Data IO happens on the calling thread without the
/// lock: `Writer.append` blocks for one write of its chunk to the page cache plus its hash (a
/// 256 KiB chunk: ~0.3 ms), `Reader.next` for one (`blockSize`, 256 KiB by default) block
/// read plus its hash, `open` for two small reads (none for a record it keeps). A call that
/// needs room evicts, and unlinking an evicted body (outside the lock) can take milliseconds
/// for a large one on ext4.
/// `init` scans the directory before it returns: one small read and two stats per entry
/// (measured: 2,000 entries in ~0.2 s with the page cache warm, ~0.8 s cold). A `Writer` or
/// `Reader` belongs to the thread that uses it (not `Sendable`).
///
/// Descriptors: the tier owns its directory's (closed in `deinit`, which releases the lock); a
/// `Writer` owns its temporary's until it commits or aborts, and its OpenSSL hash context until
/// `deinit`; a `Reader` owns its body file's until it is released. No pointer is handed to C
/// beyond the duration of a call.
public final class DiskCacheTier: Sendable {
    /// Body blocks are hashed and read in units of 256 KiB by default (4 KiB to 1 GiB).
    public static let defaultBlockSize = 256 * 1024

    public let directory: String
    public let capacity: UInt64
    let blockSize: Int
    let directoryFD: Int32
    let log: @Sendable (String) -> Void
    /// What the start-up scan found.
    public let startScan: ScanSummary

    /// A key keeps at most this many variants (8).
    public static let maxVariants = 8

    struct Entry {
        var generation: UInt64
        /// The record's and the body file's sizes together.
        var bytes: UInt64
        var recordBytes: UInt64
        /// The key and variant the entry's full key is made of.
        var key: String
        var variant: String
        /// The index's clock when the entry was last committed or opened (the key's least
        /// recently used variant goes first past `maxVariants`).
        var lastUse: UInt64 = 0
        /// The body's blocks this process verified, and at which identity of its file (what a
        /// hit sent by the kernel may skip reading; `DiskCacheTier+KernelSend`).
        var verified: DiskBlockVerification?
    }
    struct Failure {
        var code: Int32
        var count: Int
    }
    struct Index {
        var entries: [String: Entry] = [:]
        /// Each key's variants and their entries' names.
        var groups: [String: [String: String]] = [:]
        var clock: UInt64 = 0
        var order = LRUOrder<String>()
        var committedBytes: UInt64 = 0
        var reservedBytes: UInt64 = 0
        var failure: Failure?
        /// Generations of the writes in progress, by key (all variants together).
        var writing: [String: Set<UInt64>] = [:]
        /// Writes in progress whose key was removed meanwhile: their commit fails.
        var cancelled: Set<UInt64> = []
        /// The records this process read and verified (what a hit need not read again).
        var decoded = DiskDecodedRecords()

        /// Adds (or replaces) `name`'s entry, indexed under its key's variants.
        mutating func insert(_ name: String, _ entry: Entry) {
            var entry = entry
            clock += 1
            entry.lastUse = clock
            entries[name] = entry
            decoded.remove(name)
            groups[entry.key, default: [:]][entry.variant] = name
            order.touch(name)
        }

        /// Marks `name`'s entry used now.
        mutating func touch(_ name: String) {
            clock += 1
            entries[name]?.lastUse = clock
            order.touch(name)
        }

        /// Takes `name`'s entry out of the index (not its files).
        mutating func take(_ name: String) -> Entry? {
            guard let entry = entries.removeValue(forKey: name) else { return nil }
            order.remove(name)
            decoded.remove(name)
            committedBytes -= entry.bytes
            groups[entry.key]?[entry.variant] = nil
            if groups[entry.key]?.isEmpty == true { groups[entry.key] = nil }
            return entry
        }
    }

    /// The full key of `key`'s `variant` (what names its files and is kept in its record).
    static func entryKey(_ key: String, variant: String) -> String {
        variant.isEmpty ? key : key + "\u{0}" + variant
    }

    /// A full key's key and variant (split at the first NUL).
    static func splitEntryKey(_ bytes: [UInt8]) -> (key: String, variant: String) {
        guard let nul = bytes.firstIndex(of: 0) else { return (String(decoding: bytes, as: UTF8.self), "") }
        return (String(decoding: bytes[..<nul], as: UTF8.self), String(decoding: bytes[(nul + 1)...], as: UTF8.self))
    }
    let index: Mutex<Index>
    /// Body bytes queued for the kernel to send (`sendfile`) and body bytes read and hashed to
    /// verify them for it (`sluice_cache_disk_sendfile_bytes_total`,
    /// `sluice_cache_disk_verified_bytes_total`; read at each `/metrics`).
    let sendfileBytes = Atomic<UInt64>(0)
    let verifiedBytes = Atomic<UInt64>(0)

    public struct Usage: Equatable, Sendable {
        public var entries: Int
        public var bytes: UInt64
    }

    public struct ScanSummary: Equatable, Sendable {
        /// Entries found intact and indexed.
        public var kept = 0
        /// Records or bodies dropped as torn, garbage, unreadable or unreferenced.
        public var dropped = 0
        /// Writes in progress that a previous process left behind.
        public var temporaries = 0
        /// Entries evicted because the directory held more than `capacity`.
        public var evicted = 0
    }

    public enum OpenError: Error, Equatable, CustomStringConvertible {
        case cannotCreate(path: String, code: Int32)
        case cannotOpen(path: String, code: Int32)
        case inUse(path: String)

        public var description: String {
            switch self {
            case .cannotCreate(let path, let code):
                return "cannot create the cache directory \(path): \(String(cString: strerror(code)))"
            case .cannotOpen(let path, let code):
                return "cannot open the cache directory \(path): \(String(cString: strerror(code)))"
            case .inUse(let path):
                return "the cache directory \(path) is in use by another process"
            }
        }
    }

    /// A block whose bytes do not match their digest: the entry was dropped; a caller that has
    /// sent part of the body must abort the response.
    public struct CorruptEntry: Error, Equatable {
        public var block: Int
    }

    /// Opens (creating it and its parents, mode 0700) the tier's directory, takes it for this
    /// process and scans it: temporaries and anything torn or unreferenced are removed, the
    /// rest is indexed, and entries beyond `capacity` are evicted.
    public init(
        directory: String, capacity: UInt64, blockSize: Int = defaultBlockSize,
        log: @escaping @Sendable (String) -> Void
    ) throws(OpenError) {
        precondition(DiskEntryRecord.blockSizes.contains(UInt32(clamping: blockSize)), "blockSize: 4 KiB to 1 GiB")
        self.directory = directory
        self.capacity = capacity
        self.blockSize = blockSize
        self.log = log
        try Self.makeDirectories(directory)
        let fd = Glibc.open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw .cannotOpen(path: directory, code: errno) }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            let code = errno
            close(fd)
            if code == EWOULDBLOCK { throw .inUse(path: directory) }
            throw .cannotOpen(path: directory, code: code)
        }
        directoryFD = fd
        var found = Index()
        startScan = DiskDirectoryScan.run(directoryFD: fd, capacity: capacity, into: &found)
        index = Mutex(found)
    }

    deinit {
        close(directoryFD)  // also releases the flock
    }

    public var usage: Usage {
        index.withLock { Usage(entries: $0.entries.count, bytes: $0.committedBytes) }
    }

    /// Keys' entry names from the least to the most recently used (tests, diagnostics).
    var namesOldestFirst: [String] { index.withLock { $0.order.keysOldestFirst } }

    /// Starts storing `key`'s body. Nil when the metadata or key is too large or the body file
    /// cannot be created (a failure episode, logged once).
    public func beginWrite(key: String, variant: String = "", metadata: [UInt8]) -> Writer? {
        let full = Self.entryKey(key, variant: variant)
        let keyBytes = Array(full.utf8)
        guard metadata.count <= DiskEntryRecord.maxMetadata, keyBytes.count <= DiskEntryRecord.maxKey else { return nil }
        let name = DiskEntryNames.name(forKey: full)
        let generation = UInt64.random(in: 1...UInt64.max)
        let fd = openat(
            directoryFD, DiskEntryNames.bodyTemporary(name, generation),
            O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            writeFailed(code: errno, operation: "create a body file")
            return nil
        }
        index.withLock { _ = $0.writing[key, default: []].insert(generation) }
        return Writer(
            tier: self, name: name, key: key, variant: variant, fullKey: keyBytes, metadata: metadata,
            generation: generation, fd: fd)
    }

    /// The variants `key` has entries for (`""` for the entry without one), most recently used
    /// first. No file is touched.
    public func variants(of key: String) -> [String] {
        index.withLock { index in
            guard let group = index.groups[key] else { return [] }
            return group.sorted { index.entries[$0.value]!.lastUse > index.entries[$1.value]!.lastUse }.map(\.key)
        }
    }

    /// Opens `key`'s entry for reading, making it the most recently used. Nil on a miss, and
    /// for an entry whose record or trailer fails verification (which is dropped).
    ///
    /// `touch: false` leaves the LRU order alone (a lookup opening every variant touches only
    /// the one it serves, `touch(_:)`).
    ///
    /// A record this process already verified (`DiskDecodedRecords`) is not read again while
    /// its file's identity is unchanged: the open is one `fstatat` of the record, the body
    /// file's `openat` and its `fstat` (a body that is not its record's size is a miss).
    public func open(key: String, variant: String = "", touch: Bool = true) -> Reader? {
        var vanished: (name: String, generation: UInt64)?
        let found = index.withLock { index -> Opening? in
            // The key's variants name their entries: a lookup does not hash the key.
            guard let name = index.groups[key]?[variant], let entry = index.entries[name] else { return nil }
            let files: Opening.Files?
            if let kept = index.decoded.lookUp(name, generation: entry.generation),
                DiskFileIdentity.of(kept.recordFile, in: directoryFD) == kept.identity
            {
                let body = openat(directoryFD, kept.bodyFile, O_RDONLY | O_CLOEXEC)
                files = body >= 0 ? .kept(kept, body: body) : nil
            } else {
                let record = openat(directoryFD, DiskEntryNames.record(name), O_RDONLY | O_CLOEXEC)
                let body =
                    record >= 0 ? openat(directoryFD, DiskEntryNames.body(name, entry.generation), O_RDONLY | O_CLOEXEC) : -1
                if body < 0, record >= 0 { close(record) }
                files = body >= 0 ? .read(record: record, body: body) : nil
            }
            guard let files else {
                // Deleted behind the tier's back: forget the entry rather than count it forever.
                removeLocked(name, &index)
                vanished = (name, entry.generation)
                return nil
            }
            if touch { index.touch(name) }
            return Opening(name: name, generation: entry.generation, files: files, verified: entry.verified)
        }
        if let vanished { unlinkat(directoryFD, DiskEntryNames.body(vanished.name, vanished.generation), 0) }
        guard let found else { return nil }
        let kept: DiskDecodedRecords.Record
        var keptAt: DiskFileIdentity?
        switch found.files {
        case .kept(let record, let body):
            var st = stat()
            guard fstat(body, &st) == 0, UInt64(st.st_size) == record.record.bodyFileSize else {
                close(body)
                drop(name: found.name, generation: found.generation)
                return nil
            }
            kept = record
            keptAt = record.identity
        case .read(let recordFD, let body):
            guard let read = readRecord(recordFD, body: body, found) else {
                close(body)
                drop(name: found.name, generation: found.generation)
                return nil
            }
            kept = read
            if read.identity.isSettled(now: DiskFileIdentity.now()), read.record.holds(key: key, variant: variant) {
                keptAt = index.withLock { index -> DiskFileIdentity? in
                    guard index.entries[found.name]?.generation == found.generation else { return nil }
                    index.decoded.keep(found.name, read)
                    return read.identity
                }
            }
        }
        guard kept.record.holds(key: key, variant: variant) else {
            close(found.files.body)  // another key with the same SHA-256: a miss, not a fault
            return nil
        }
        return Reader(tier: self, name: found.name, kept, keptAt: keptAt, fd: found.files.body, verified: found.verified)
    }

    /// An entry `open` found, with its files open.
    struct Opening {
        enum Files {
            /// A record kept verified: only the body file was opened.
            case kept(DiskDecodedRecords.Record, body: Int32)
            /// The record file (to read and verify) and the body file.
            case read(record: Int32, body: Int32)

            var body: Int32 {
                switch self {
                case .kept(_, let body), .read(_, let body): return body
                }
            }
        }
        var name: String
        var generation: UInt64
        var files: Files
        var verified: DiskBlockVerification?
    }

    /// Reads, verifies and closes `opening`'s record file, and reads and checks its body
    /// file's trailer against it; nil when either fails or the record names another body.
    private func readRecord(_ fd: Int32, body: Int32, _ opening: Opening) -> DiskDecodedRecords.Record? {
        // The identity before the bytes: a change while they are read leaves the file with
        // another identity than the one kept, so the next open reads it again.
        let identity = DiskFileIdentity.of(fd)
        let bytes = DiskFile.readRecord(fd)
        close(fd)
        guard let bytes, let identity, let record = DiskEntryRecord.decode(bytes),
            record.generation == opening.generation, let trailer = DiskFile.readTrailer(body, record)
        else { return nil }
        return DiskDecodedRecords.Record(
            identity: identity, record: record, trailer: trailer, recordFile: DiskEntryNames.record(opening.name),
            bodyFile: DiskEntryNames.body(opening.name, opening.generation))
    }

    /// Replaces `key`'s metadata, keeping its body (crash-safe: a new record renamed over the
    /// old). False on a miss, a failed write, or when a newer commit replaced the entry first.
    /// With `expectedGeneration`, only that body's head is replaced (not the head of a newer
    /// body a commit put there meanwhile).
    @discardableResult
    public func updateMetadata(
        key: String, variant: String = "", expectedGeneration: UInt64? = nil, _ metadata: [UInt8]
    ) -> Bool {
        guard metadata.count <= DiskEntryRecord.maxMetadata else { return false }
        let full = Self.entryKey(key, variant: variant)
        let name = DiskEntryNames.name(forKey: full)
        let opened = index.withLock { index -> (fd: Int32, generation: UInt64)? in
            guard let entry = index.entries[name], expectedGeneration.map({ $0 == entry.generation }) ?? true else {
                return nil
            }
            let fd = openat(directoryFD, DiskEntryNames.record(name), O_RDONLY | O_CLOEXEC)
            return fd >= 0 ? (fd, entry.generation) : nil
        }
        guard let opened else { return false }
        let bytes = DiskFile.readRecord(opened.fd)
        close(opened.fd)
        guard let bytes, var record = DiskEntryRecord.decode(bytes), record.generation == opened.generation else {
            drop(name: name, generation: opened.generation)
            return false
        }
        guard record.key == Array(full.utf8) else { return false }
        record.metadata = metadata
        let encoded = record.encoded()
        let temporary = DiskEntryNames.recordTemporary(name, UInt64.random(in: 1...UInt64.max))
        if let code = DiskFile.create(directoryFD, temporary, encoded) {
            writeFailed(code: code, operation: "write a record")
            return false
        }
        let done = index.withLock { index -> Bool in
            guard var entry = index.entries[name], entry.generation == opened.generation,
                renameat(directoryFD, temporary, directoryFD, DiskEntryNames.record(name)) == 0
            else { return false }
            let size = UInt64(encoded.count)
            index.committedBytes = index.committedBytes - entry.recordBytes + size
            entry.bytes = entry.bytes - entry.recordBytes + size
            entry.recordBytes = size
            index.entries[name] = entry
            index.decoded.remove(name)
            return true
        }
        if !done { unlinkat(directoryFD, temporary, 0) }
        return done
    }

    /// Invalidates every variant of `key` (readers that have one open keep reading it) and the
    /// writes of `key` in progress: their `commit()` fails, so a response that was streaming in
    /// when its key was invalidated is not stored.
    public func remove(key: String) {
        let removed = index.withLock { index -> [String] in
            if let writing = index.writing[key] { index.cancelled.formUnion(writing) }
            var bodies: [String] = []
            for name in Array((index.groups[key] ?? [:]).values) {
                if let entry = removeLocked(name, &index) { bodies.append(DiskEntryNames.body(name, entry.generation)) }
            }
            return bodies
        }
        for body in removed { unlinkat(directoryFD, body, 0) }
    }

    /// Opens a write's temporary body file for reading (`Writer.temporaryName`: a fill in
    /// progress that others read, `FillStream`); nil once it was committed or abandoned. The
    /// descriptor is the caller's; it reads what the writer wrote so far.
    func openTemporary(_ name: String) -> Int32? {
        let fd = openat(directoryFD, name, O_RDONLY | O_CLOEXEC)
        return fd >= 0 ? fd : nil
    }

    /// Makes the entry named `name` (`Reader.name`, `CacheObject.DiskEntry`) the most recently
    /// used: one lock, no file.
    public func touch(_ name: String) {
        index.withLock { $0.touch(name) }
    }

    /// Removes the one entry of `key`'s `variant` (its metadata cannot be decoded, say),
    /// leaving the key's other variants and its writes in progress alone.
    public func remove(key: String, variant: String) {
        let name = DiskEntryNames.name(forKey: Self.entryKey(key, variant: variant))
        let removed = index.withLock { removeLocked(name, &$0) }
        if let removed { unlinkat(directoryFD, DiskEntryNames.body(name, removed.generation), 0) }
    }

    /// Drops an entry found corrupt, unless a newer commit already replaced it.
    func drop(name: String, generation: UInt64) {
        let dropped = index.withLock { index -> Bool in
            guard index.entries[name]?.generation == generation else { return false }
            removeLocked(name, &index)
            return true
        }
        if dropped { unlinkat(directoryFD, DiskEntryNames.body(name, generation), 0) }
    }

    /// Removes `name` from the index and unlinks its record (under the lock, so that a commit
    /// of the same name cannot slip in between); the caller unlinks the body afterwards.
    @discardableResult
    func removeLocked(_ name: String, _ index: inout Index) -> Entry? {
        guard let entry = index.take(name) else { return nil }
        unlinkat(directoryFD, DiskEntryNames.record(name), 0)
        return entry
    }

    /// Evicts least recently used entries until `bytes` more fit; returns the bodies to unlink
    /// (after the lock), or nil if they cannot fit even with nothing committed.
    func evictLocked(toFit bytes: UInt64, _ index: inout Index) -> [String]? {
        guard index.reservedBytes + bytes <= capacity else { return nil }
        var bodies: [String] = []
        while index.committedBytes + index.reservedBytes + bytes > capacity, let oldest = index.order.oldest {
            let generation = index.entries[oldest]!.generation
            removeLocked(oldest, &index)
            bodies.append(DiskEntryNames.body(oldest, generation))
        }
        return bodies
    }

    /// Reserves `bytes` of the capacity for a write in progress, evicting as needed.
    func reserve(_ bytes: UInt64) -> Bool {
        let bodies = index.withLock { index -> [String]? in
            guard let bodies = evictLocked(toFit: bytes, &index) else { return nil }
            index.reservedBytes += bytes
            return bodies
        }
        guard let bodies else { return false }
        for body in bodies { unlinkat(directoryFD, body, 0) }
        return true
    }

    /// A write ended without committing: forgets it and releases its reservation.
    func writeEnded(key: String, generation: UInt64, reserved bytes: UInt64) {
        index.withLock { index in
            index.reservedBytes -= bytes
            Self.forgetWriteLocked(key, generation, &index)
        }
    }

    static func forgetWriteLocked(_ key: String, _ generation: UInt64, _ index: inout Index) {
        index.cancelled.remove(generation)
        guard var writing = index.writing[key] else { return }
        writing.remove(generation)
        index.writing[key] = writing.isEmpty ? nil : writing
    }

    private static func makeDirectories(_ path: String) throws(OpenError) {
        var prefix = path.hasPrefix("/") ? "/" : ""
        for part in path.split(separator: "/") {
            prefix += part
            if mkdir(prefix, 0o700) != 0 && errno != EEXIST { throw .cannotCreate(path: path, code: errno) }
            prefix += "/"
        }
        var st = stat()
        guard stat(path, &st) == 0 else { throw .cannotCreate(path: path, code: errno) }
        guard st.st_mode & S_IFMT == S_IFDIR else { throw .cannotCreate(path: path, code: ENOTDIR) }
    }
}

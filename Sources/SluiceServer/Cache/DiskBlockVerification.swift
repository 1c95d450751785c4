#if canImport(Glibc)
    import Glibc
#endif

/// What a body file is, as far as `fstat` says without reading it: device, inode, size, and
/// the modification and status-change times. Any write to the file changes its ctime (the
/// kernel sets it to the current time; no system call lets a process set it back), a
/// replacement changes the inode, a truncation the size: a block verified at one identity is
/// still the same bytes while the identity is the same.
///
/// Threading: a value.
struct DiskFileIdentity: Equatable, Sendable {
    var device: UInt64
    var inode: UInt64
    var size: Int64
    var modified: Timestamp
    var changed: Timestamp

    /// A `timespec` as a comparable value.
    struct Timestamp: Equatable, Comparable, Sendable {
        var seconds: Int64
        var nanoseconds: Int64

        init(seconds: Int64, nanoseconds: Int64) {
            self.seconds = seconds
            self.nanoseconds = nanoseconds
        }

        init(_ t: timespec) {
            self.init(seconds: Int64(t.tv_sec), nanoseconds: Int64(t.tv_nsec))
        }

        static func < (a: Timestamp, b: Timestamp) -> Bool {
            (a.seconds, a.nanoseconds) < (b.seconds, b.nanoseconds)
        }
    }

    init(device: UInt64, inode: UInt64, size: Int64, modified: Timestamp, changed: Timestamp) {
        self.device = device
        self.inode = inode
        self.size = size
        self.modified = modified
        self.changed = changed
    }

    init(_ st: stat) {
        self.init(
            device: UInt64(st.st_dev), inode: UInt64(st.st_ino), size: Int64(st.st_size),
            modified: Timestamp(st.st_mtim), changed: Timestamp(st.st_ctim))
    }

    /// The identity of the file open at `fd`; nil if `fstat` fails.
    static func of(_ fd: Int32) -> DiskFileIdentity? {
        var st = stat()
        return fstat(fd, &st) == 0 ? DiskFileIdentity(st) : nil
    }

    /// The identity of the file `name` in the directory open at `directoryFD` (not following
    /// a symbolic link); nil if it is not there.
    static func of(_ name: String, in directoryFD: Int32) -> DiskFileIdentity? {
        var st = stat()
        return fstatat(directoryFD, name, &st, AT_SYMLINK_NOFOLLOW) == 0 ? DiskFileIdentity(st) : nil
    }

    /// A file's timestamps have a clock tick's resolution (a few milliseconds), so a write in
    /// the same tick as the change before it could leave its ctime as it was. A verification
    /// is therefore only remembered once the file's last change is this long past (1 s, as
    /// git treats a file changed in the second its index was written as "racily clean").
    static let settleSeconds: Int64 = 1

    /// Whether the file's last change is at least `settleSeconds` before `now` (its ctime as
    /// the kernel set it cannot be repeated by a later write).
    func isSettled(now: Timestamp) -> Bool {
        Timestamp(seconds: changed.seconds + Self.settleSeconds, nanoseconds: changed.nanoseconds) <= now
    }

    /// The wall-clock time, the clock file timestamps are taken from.
    static func now() -> Timestamp {
        var t = timespec()
        clock_gettime(CLOCK_REALTIME, &t)
        return Timestamp(t)
    }
}

/// Which blocks of one disk entry's body this process read and found matching their digests,
/// and at which identity of the body file (`DiskFileIdentity`): a block recorded here is sent
/// by the kernel (`sendfile`) without being read again while the file's identity stays the
/// same. Recording a block at another identity forgets every block recorded before it.
///
/// Bounded: one bit per block (a 1 GiB body in 256 KiB blocks: 512 bytes). The tier keeps one
/// per entry in its index and drops it with the entry (`DiskCacheTier.Entry.verified`).
///
/// Threading: a value; the tier's copy lives under its index lock, a reader works on its own.
struct DiskBlockVerification: Equatable, Sendable {
    /// The identity the recorded blocks were verified at.
    private(set) var identity: DiskFileIdentity
    private var words: [UInt64] = []

    init(identity: DiskFileIdentity) {
        self.identity = identity
    }

    /// Whether `block` was verified at `identity`.
    func contains(_ block: Int, at identity: DiskFileIdentity) -> Bool {
        guard identity == self.identity else { return false }
        let word = block >> 6
        return word < words.count && words[word] & (1 << UInt64(block & 63)) != 0
    }

    /// Records `block` as verified at `identity`; an identity other than the recorded one
    /// starts the record over.
    mutating func insert(_ block: Int, at identity: DiskFileIdentity) {
        if identity != self.identity {
            self.identity = identity
            words = []
        }
        let word = block >> 6
        if word >= words.count { words += Array(repeating: 0, count: word + 1 - words.count) }
        words[word] |= 1 << UInt64(block & 63)
    }

    /// Adds what `newer` (a reader's record, made after this one was taken) verified: its
    /// blocks join these at the same identity, and replace them at another (the file changed).
    mutating func merge(_ newer: DiskBlockVerification) {
        guard newer.identity == identity else {
            self = newer
            return
        }
        if newer.words.count > words.count { words += Array(repeating: 0, count: newer.words.count - words.count) }
        for (i, w) in newer.words.enumerated() { words[i] |= w }
    }

    /// The number of blocks recorded.
    var count: Int { words.reduce(0) { $0 + $1.nonzeroBitCount } }
}

import SluiceCore

/// The disk tier's records this process read, verified and decoded, kept per entry so that a
/// hit does not read, seal-check and decode its record (and its body's digest list) again:
/// while the record file's identity (`DiskFileIdentity`, one `fstatat`) is the one it had when
/// it was read, its bytes are the ones that were verified. A record file with any other
/// identity (rewritten in place, replaced, truncated) is read and verified again, as at a
/// first open. Kept beside the record: the caller's decoding of its metadata (the cache's
/// `CacheObject`, `attach`), so that the head is not parsed again either.
///
/// A record is kept only once its file's last change is `DiskFileIdentity.settleSeconds` old
/// (a later write in the same clock tick could leave its timestamps as they were), and only
/// with its entry's generation: an entry replaced or removed drops it (`DiskCacheTier.Index`).
///
/// Bounded: at most `budget` bytes (`defaultBudget`, 4 MiB) counted as the record's key, its
/// metadata three times (the bytes, their decoded fields and the cache's serialized field
/// lines), its digest list and a fixed overhead; past it the least recently used go. A record
/// larger than an eighth of the budget is not kept. Nothing is allocated until the first
/// record is kept.
///
/// Threading: a value inside the tier's index, under its lock.
struct DiskDecodedRecords {
    /// 4 MiB: a few thousand typical entries (a head of a few hundred bytes, a short key, one
    /// digest), the hot set of a cache whose misses cost a record read and a head decoding
    /// (tens of microseconds).
    static let defaultBudget = 4 << 20
    /// What a kept record costs beside its byte arrays: the strings, the index's slots.
    static let overhead = 512

    /// One verified record, as read from its file (immutable: a hit takes it with one retain).
    final class Record: Sendable {
        /// The record file's identity when it was read.
        let identity: DiskFileIdentity
        let record: DiskEntryRecord
        /// The body file's per-block digests, checked against `record.trailerDigest`.
        let trailer: [UInt8]
        /// The entry's file names (`DiskEntryNames`), built once.
        let recordFile: String
        let bodyFile: String
        /// The caller's decoding of `record.metadata`, once it attached one.
        let decoded: (any Sendable)?

        init(
            identity: DiskFileIdentity, record: DiskEntryRecord, trailer: [UInt8], recordFile: String,
            bodyFile: String, decoded: (any Sendable)? = nil
        ) {
            self.identity = identity
            self.record = record
            self.trailer = trailer
            self.recordFile = recordFile
            self.bodyFile = bodyFile
            self.decoded = decoded
        }

        /// The same record with the caller's decoding attached.
        func attaching(_ decoded: any Sendable) -> Record {
            Record(
                identity: identity, record: record, trailer: trailer, recordFile: recordFile, bodyFile: bodyFile,
                decoded: decoded)
        }

        var bytes: Int {
            DiskDecodedRecords.overhead + record.key.count + 3 * record.metadata.count + trailer.count
        }
    }

    let budget: Int
    private(set) var bytes = 0
    private var records: [String: Record] = [:]
    private var order = LRUOrder<String>()

    init(budget: Int = defaultBudget) {
        self.budget = budget
    }

    var count: Int { records.count }

    /// The record kept for the entry named `name` at `generation`, made the most recently used.
    mutating func lookUp(_ name: String, generation: UInt64) -> Record? {
        guard let record = records[name], record.record.generation == generation else { return nil }
        order.touch(name)
        return record
    }

    /// Keeps `record` for the entry named `name` (replacing what was kept), evicting the least
    /// recently used past the budget; a record over an eighth of the budget is not kept.
    mutating func keep(_ name: String, _ record: Record) {
        remove(name)
        let size = record.bytes
        guard size <= budget / 8 else { return }
        while bytes + size > budget, let oldest = order.oldest { remove(oldest) }
        records[name] = record
        order.touch(name)
        bytes += size
    }

    /// Attaches the caller's decoding of the metadata of the record kept for `name`, if the
    /// record kept is still the one read at `identity`.
    mutating func attach(_ name: String, identity: DiskFileIdentity, _ decoded: any Sendable) {
        guard let record = records[name], record.identity == identity else { return }
        records[name] = record.attaching(decoded)
    }

    /// Forgets the record kept for `name` (its entry was replaced, updated or removed).
    mutating func remove(_ name: String) {
        guard let record = records.removeValue(forKey: name) else { return }
        order.remove(name)
        bytes -= record.bytes
    }
}

#if canImport(Glibc)
    import Glibc
#endif

/// The disk tier's start-up scan: rebuilds the index from the directory. Reads each record
/// (a few KiB) and stats its body file; never reads a body. Removes temporaries, records that
/// fail their seal or name a missing or wrong-sized body, and bodies no record names; orders
/// the rest by record mtime (oldest first) and evicts beyond `capacity`. Files whose names
/// are not the tier's are left alone.
///
/// Threading: runs once in `DiskCacheTier.init`, before the tier is shared.
enum DiskDirectoryScan {
    static func run(directoryFD: Int32, capacity: UInt64, into index: inout DiskCacheTier.Index) -> DiskCacheTier.ScanSummary {
        var summary = DiskCacheTier.ScanSummary()
        var records: [String] = []
        var bodies: [(name: String, generation: UInt64, file: String)] = []
        for file in list(directoryFD) {
            switch DiskEntryNames.classify(file) {
            case .record(let name): records.append(name)
            case .body(let name, let generation): bodies.append((name, generation, file))
            case .temporary:
                unlinkat(directoryFD, file, 0)
                summary.temporaries += 1
            case .foreign: break
            }
        }
        var kept: [(name: String, entry: DiskCacheTier.Entry, mtime: timespec)] = []
        for name in records {
            let file = DiskEntryNames.record(name)
            let fd = openat(directoryFD, file, O_RDONLY | O_CLOEXEC)
            var st = stat()
            let bytes = fd >= 0 ? DiskFile.readRecord(fd) : nil
            if fd >= 0 {
                fstat(fd, &st)
                close(fd)
            }
            guard let bytes, let record = DiskEntryRecord.decode(bytes),
                DiskEntryNames.name(forKey: String(decoding: record.key, as: UTF8.self)) == name
            else {
                unlinkat(directoryFD, file, 0)
                summary.dropped += 1
                continue
            }
            var bodyStat = stat()
            guard fstatat(directoryFD, DiskEntryNames.body(name, record.generation), &bodyStat, 0) == 0,
                UInt64(bodyStat.st_size) == record.bodyFileSize
            else {
                unlinkat(directoryFD, file, 0)
                summary.dropped += 1
                continue
            }
            let parts = DiskCacheTier.splitEntryKey(record.key)
            let entry = DiskCacheTier.Entry(
                generation: record.generation, bytes: UInt64(bytes.count) + record.bodyFileSize,
                recordBytes: UInt64(bytes.count), key: parts.key, variant: parts.variant)
            kept.append((name, entry, st.st_mtim))
        }
        kept.sort { ($0.mtime.tv_sec, $0.mtime.tv_nsec) < ($1.mtime.tv_sec, $1.mtime.tv_nsec) }
        for k in kept {
            index.insert(k.name, k.entry)
            index.committedBytes += k.entry.bytes
        }
        for body in bodies where index.entries[body.name]?.generation != body.generation {
            unlinkat(directoryFD, body.file, 0)
            summary.dropped += 1
        }
        while index.committedBytes > capacity, let oldest = index.order.oldest {
            let entry = index.take(oldest)!
            unlinkat(directoryFD, DiskEntryNames.record(oldest), 0)
            unlinkat(directoryFD, DiskEntryNames.body(oldest, entry.generation), 0)
            summary.evicted += 1
        }
        summary.kept = index.entries.count
        return summary
    }

    private static func list(_ directoryFD: Int32) -> [String] {
        let fd = dup(directoryFD)
        guard fd >= 0, let dir = fdopendir(fd) else { return [] }
        defer { closedir(dir) }
        rewinddir(dir)
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(cString: raw.bindMemory(to: CChar.self).baseAddress!)
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return names
    }
}

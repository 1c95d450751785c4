#if canImport(Glibc)
    import Glibc
#endif

/// The disk tier's blocking file IO, retried on `EINTR` and short transfers.
///
/// Threading: stateless; runs on the calling thread.
enum DiskFile {
    /// Writes all of `data` at the descriptor's offset; the errno of a failure, or nil.
    static func writeAll(_ fd: Int32, _ data: UnsafeRawBufferPointer) -> Int32? {
        var done = 0
        while done < data.count {
            let n = write(fd, data.baseAddress! + done, data.count - done)
            if n < 0 {
                if errno == EINTR { continue }
                return errno
            }
            if n == 0 { return EIO }
            done += n
        }
        return nil
    }

    /// Reads `count` bytes at `offset`; nil on an error or a short file.
    static func preadAll(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer, offset: UInt64) -> Bool {
        var done = 0
        while done < buffer.count {
            let n = pread(fd, buffer.baseAddress! + done, buffer.count - done, off_t(offset) + off_t(done))
            if n < 0 {
                if errno == EINTR { continue }
                return false
            }
            if n == 0 { return false }
            done += n
        }
        return true
    }

    static func read(_ fd: Int32, count: Int, offset: UInt64) -> [UInt8]? {
        var out = [UInt8](repeating: 0, count: count)
        let ok = out.withUnsafeMutableBytes { preadAll(fd, into: $0, offset: offset) }
        return ok ? out : nil
    }

    /// A whole record file, sized by its own header; nil if it is shorter, longer or not a
    /// record.
    static func readRecord(_ fd: Int32) -> [UInt8]? {
        guard let header = read(fd, count: DiskEntryRecord.fixedSize, offset: 0),
            let size = DiskEntryRecord.expectedSize(header: header)
        else { return nil }
        var st = stat()
        guard fstat(fd, &st) == 0, st.st_size == off_t(size) else { return nil }
        return read(fd, count: size, offset: 0)
    }

    /// The body file's trailer (per-block digests), checked against the record; nil if the
    /// file is not the size the record says or the trailer does not match.
    static func readTrailer(_ fd: Int32, _ record: DiskEntryRecord) -> [UInt8]? {
        var st = stat()
        guard fstat(fd, &st) == 0, UInt64(st.st_size) == record.bodyFileSize,
            let trailer = read(fd, count: record.blockCount * Digest32.size, offset: record.bodyLength),
            trailer.withUnsafeBytes({ record.trailerDigest.matches($0) })
        else { return nil }
        return trailer
    }

    /// Creates `name` in the directory with `data` (mode 0600, must not exist); the errno of a
    /// failure (the partial file removed), or nil.
    static func create(_ directoryFD: Int32, _ name: String, _ data: [UInt8]) -> Int32? {
        let fd = openat(directoryFD, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return errno }
        var failure = data.withUnsafeBytes { writeAll(fd, $0) }
        if close(fd) != 0, failure == nil { failure = errno }
        if failure != nil { unlinkat(directoryFD, name, 0) }
        return failure
    }
}

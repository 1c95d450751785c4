import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// The disk tier's write failures, logged once per episode: the first failure (what failed and
/// why), then nothing until a commit succeeds, which logs the recovery with the count.
///
/// Threading: called from any worker; the episode lives in the tier's index `Mutex`, and
/// lines are logged outside it.
extension DiskCacheTier {
    /// A write failed with `code`: the first failure of an episode is logged.
    func writeFailed(code: Int32, operation: String) {
        SluiceMetrics.shared.recordCacheDiskWriteFailure()
        let first = index.withLock { index -> Bool in
            if index.failure != nil {
                index.failure!.count += 1
                return false
            }
            index.failure = Failure(code: code, count: 1)
            return true
        }
        if first {
            log(
                "disk cache \(directory): cannot \(operation): \(String(cString: strerror(code))) (\(Self.errnoName(code))); "
                    + "responses are served without the disk tier until a write succeeds (logged once)")
        }
    }

    /// Called under the lock by a commit that succeeded: ends a failure episode.
    func recoveredLocked(_ index: inout Index) -> String? {
        guard let failure = index.failure else { return nil }
        index.failure = nil
        return
            "disk cache \(directory): writing again after \(failure.count) failed write(s) (first: \(Self.errnoName(failure.code)))"
    }

    static func errnoName(_ code: Int32) -> String {
        switch code {
        case ENOSPC: return "ENOSPC"
        case EDQUOT: return "EDQUOT"
        case EACCES: return "EACCES"
        case EPERM: return "EPERM"
        case EROFS: return "EROFS"
        case EFBIG: return "EFBIG"
        case EIO: return "EIO"
        case ENOENT: return "ENOENT"
        case EMFILE: return "EMFILE"
        default: return "errno \(code)"
        }
    }
}

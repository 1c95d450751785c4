import SluiceCore
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// What the log says when accept() fails (`Worker.acceptFailed`): one warning when an episode
/// starts — why (EMFILE: the descriptor limit, with its value and how many are open), and
/// what happens meanwhile — and one line when it ends, with how long it lasted and how many
/// accept() calls failed. In between, failures are only counted, however often every worker
/// meets them: a proxy out of descriptors must not also flood its log.
///
/// An episode ends at the first accept that comes `quietSeconds` after its last failure; an
/// episode whose last failure is older than `staleSeconds` when a new one happens is ended
/// then (its end line is logged, then the new start).
///
/// Threading: shared by every worker (the descriptor limit is the process's); each call
/// takes its lock briefly, and a worker calls it only while its own accepts are in trouble.
final class AcceptFailures: Sendable {
    static let shared = AcceptFailures()
    /// How soon a worker tries accept() again after a failure (a closing connection is
    /// sooner).
    static let retryMilliseconds = 250
    static let quietSeconds = 1.0
    static let staleSeconds = 10.0

    private struct Episode {
        var address: String
        var code: Int32
        var started: Double
        var last: Double
        var failures: Int
    }
    private let episode = Mutex<Episode?>(nil)

    private static func now() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    /// accept() on `address` failed with `code`.
    func failed(address: String, code: Int32) {
        let now = Self.now()
        var lines: [String] = []
        episode.withLock { episode in
            if var current = episode, now - current.last < Self.staleSeconds {
                current.failures += 1
                current.last = now
                episode = current
                return
            }
            if let old = episode { lines.append(Self.endLine(old)) }
            episode = Episode(address: address, code: code, started: now, last: now, failures: 1)
            lines.append(Self.startLine(address: address, code: code))
        }
        for line in lines { Log.warning(line) }
    }

    /// An accept succeeded on a worker whose accepts had failed. Returns whether the episode
    /// is still open (the worker keeps calling until it is over).
    func accepted() -> Bool {
        let now = Self.now()
        var line: String?
        let open = episode.withLock { episode -> Bool in
            guard let current = episode else { return false }
            guard now - current.last >= Self.quietSeconds else { return true }
            line = Self.endLine(current)
            episode = nil
            return false
        }
        if let line { Log.warning(line) }
        return open
    }

    private static func startLine(address: String, code: Int32) -> String {
        var why = "\(String(cString: strerror(code))) (\(errnoName(code)))"
        if code == EMFILE {
            var limit = rlimit()
            getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
            why += ": the process is at its descriptor limit (RLIMIT_NOFILE \(limit.rlim_cur), `ulimit -n`)"
        } else if code == ENFILE {
            why += ": the system is at its descriptor limit (fs.file-max)"
        }
        return "accept() on \(address) failed: \(why); new connections wait in the listen queue, accepts are retried "
            + "every \(retryMilliseconds) ms and whenever a connection closes (logged once until it recovers)"
    }

    private static func endLine(_ e: Episode) -> String {
        let seconds = (e.last - e.started) * 10
        return "accept() is working again (first failure on \(e.address)): it failed \(e.failures) time(s) "
            + "with \(errnoName(e.code)) over \(Double(Int(seconds.rounded())) / 10) s"
    }

    static func errnoName(_ code: Int32) -> String {
        switch code {
        case EMFILE: return "EMFILE"
        case ENFILE: return "ENFILE"
        case ENOBUFS: return "ENOBUFS"
        case ENOMEM: return "ENOMEM"
        default: return "errno \(code)"
        }
    }
}

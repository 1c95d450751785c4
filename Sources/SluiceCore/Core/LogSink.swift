import Logging
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A log destination (a file, stdout or stderr) written by its own thread, so that event
/// loops never wait on a disk. Each worker's monitor appends to its own `Buffer` (an
/// uncontended lock held for one append); the writer thread swaps the buffers out every 100 ms
/// and writes them.
///
/// Sinks are shared per path for the life of the process: a reload that keeps a path keeps
/// its sink, and `flushAll()` at exit writes what is left. Buffers are not: each configuration
/// a reload loads makes new monitors with new buffers, and a buffer whose monitor is gone (its
/// configuration retired and the last exchange that used it ended) is written one last time
/// and dropped, with its capacity. A buffer that had nothing to write for a whole period gives
/// its capacity back too, so an idle sink holds no line memory.
///
/// A write that fails (a full disk: ENOSPC; a file system gone read-only: EROFS; EIO …)
/// drops what was buffered — memory stays bounded and the proxy keeps serving — and the
/// diagnostics say so once per failure episode: one warning at the first failed write, one
/// line when a write succeeds again, with the number of lines lost in between.
public final class LogSink: Sendable {
    /// Where one monitor appends its lines. Its `Queue` is what the sink sees: when the
    /// monitor lets go of the buffer, `deinit` retires the queue and the writer drops it once
    /// it has written what was left in it.
    ///
    /// Threading: appended to by one worker's thread; `deinit` runs where the last reference
    /// to it goes (that worker's thread).
    public final class Buffer: Sendable {
        fileprivate let queue = Queue()

        public func append(_ line: String) {
            var line = line
            line.withUTF8 { utf8 in queue.pending.withLock { $0.bytes.append(contentsOf: utf8) } }
        }

        public func append(bytes line: [UInt8]) {
            queue.pending.withLock { $0.bytes.append(contentsOf: line) }
        }

        public func append(bytes line: UnsafeBufferPointer<UInt8>) {
            queue.pending.withLock { $0.bytes.append(contentsOf: line) }
        }

        deinit { queue.pending.withLock { $0.retired = true } }
    }

    /// A buffer's lines on their way to the writer, double-buffered: the monitor appends to
    /// `pending`, the writer swaps `pending` with `writing` and writes that outside the
    /// monitor's lock, then empties it keeping its capacity (a busy flush allocates nothing).
    /// Held by its `Buffer` and by the sink, so that it outlives the buffer until the writer
    /// has written its last lines.
    ///
    /// Threading: `pending` is locked by the appending worker and by the writer; `writing` is
    /// touched by the writer only, under the sink's `output` lock (its mutex is never
    /// contended; it makes the type `Sendable`).
    fileprivate final class Queue: Sendable {
        struct Pending {
            var bytes: [UInt8] = []
            /// The `Buffer` is gone: nothing will be appended again.
            var retired = false
        }
        let pending = Mutex(Pending())
        let writing = Mutex<[UInt8]>([])
    }

    public let path: String
    /// The descriptor written to; `reopen()` swaps it. Held while writing, so a reopen falls
    /// between two writes.
    private let output: Mutex<Int32>
    /// Every live buffer's queue, and retired ones not yet written.
    private let queues = Mutex<[Queue]>([])
    /// The failure episode in progress, if any (touched only under `output`'s lock).
    private let failure = Mutex<WriteFailure?>(nil)
    struct WriteFailure {
        var code: Int32
        var lostLines = 0
        var lostBytes = 0
    }
    private static let registry = Mutex<[String: LogSink]>([:])
    static let flushIntervalMicroseconds: UInt32 = 100_000

    /// The sink for `path` (`stdout`, `stderr`, or a file opened for appending, mode 0640).
    public static func shared(path: String) throws -> LogSink {
        try registry.withLock { sinks in
            if let sink = sinks[path] { return sink }
            let sink = try LogSink(path: path)
            sinks[path] = sink
            sink.startWriter()
            return sink
        }
    }

    public struct OpenError: Error, CustomStringConvertible {
        public let path: String
        public let reason: String
        public var description: String { "cannot open log \(path): \(reason)" }
    }

    private init(path: String) throws {
        self.path = path
        switch path {
        case "stdout": output = Mutex(1)
        case "stderr": output = Mutex(2)
        default: output = Mutex(try Self.openFile(path))
        }
    }

    private static func openFile(_ path: String) throws(OpenError) -> Int32 {
        let opened = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o640)
        guard opened >= 0 else { throw OpenError(path: path, reason: String(cString: strerror(errno))) }
        return opened
    }

    /// Reopens a file sink by its path (SIGUSR1, after logrotate moved the file): what was
    /// logged before goes to the old file, what follows to the new one; nothing is lost. A
    /// sink that cannot open its path keeps writing to the file it has.
    public func reopen() throws(OpenError) {
        guard path != "stdout" && path != "stderr" else { return }
        let new = try Self.openFile(path)
        output.withLock { fd in
            writeBuffered(to: fd)
            close(fd)
            fd = new
        }
    }

    /// Reopens every file sink; returns the ones that failed (each keeps its old file).
    public static func reopenAll() -> (reopened: Int, failures: [OpenError]) {
        let sinks = registry.withLock { Array($0.values) }
        var reopened = 0
        var failures: [OpenError] = []
        for sink in sinks where sink.path != "stdout" && sink.path != "stderr" {
            do {
                try sink.reopen()
                reopened += 1
            } catch {
                failures.append(error)
            }
        }
        return (reopened, failures)
    }

    /// A buffer for one worker's monitor.
    public func makeBuffer() -> Buffer {
        let buffer = Buffer()
        queues.withLock { $0.append(buffer.queue) }
        return buffer
    }

    /// The buffers the sink writes: the live ones and those retired since the last flush.
    var bufferCount: Int { queues.withLock { $0.count } }

    /// The bytes the sink's buffers have room for (both halves of each).
    var bufferCapacity: Int {
        queues.withLock { queues in
            queues.reduce(0) { sum, queue in
                sum + queue.pending.withLock { $0.bytes.capacity } + queue.writing.withLock { $0.capacity }
            }
        }
    }

    private func startWriter() {
        // The writer must never take a process signal (SIGHUP's default action would kill
        // the daemon): it starts with every signal blocked, whatever its creator allows.
        var all = sigset_t()
        var previous = sigset_t()
        sigfillset(&all)
        pthread_sigmask(SIG_SETMASK, &all, &previous)
        defer { pthread_sigmask(SIG_SETMASK, &previous, nil) }
        var thread = pthread_t()
        pthread_create(
            &thread, nil,
            { arg in
                let sink = Unmanaged<LogSink>.fromOpaque(arg!).takeUnretainedValue()
                while true {
                    usleep(LogSink.flushIntervalMicroseconds)
                    sink.flush()
                }
            }, Unmanaged.passRetained(self).toOpaque())
        pthread_detach(thread)
    }

    /// Writes everything buffered so far. Called by the writer thread, and at exit.
    public func flush() {
        output.withLock { fd in writeBuffered(to: fd) }
    }

    /// Writes every queue's lines to `fd`, then drops the queues that were retired (their
    /// last lines were among those written). Called under `output`'s lock.
    private func writeBuffered(to fd: Int32) {
        let all = queues.withLock { $0 }
        var retired: [ObjectIdentifier] = []
        for queue in all {
            let gone = queue.writing.withLock { chunk -> Bool in
                let gone = queue.pending.withLock { pending -> Bool in
                    swap(&pending.bytes, &chunk)
                    // Nothing appended for a whole period: both halves give their capacity back.
                    if chunk.isEmpty { pending.bytes = [] }
                    return pending.retired
                }
                if chunk.isEmpty {
                    chunk = []
                } else {
                    writeWhole(chunk, to: fd)
                    chunk.removeAll(keepingCapacity: true)
                }
                return gone
            }
            if gone { retired.append(ObjectIdentifier(queue)) }
        }
        guard !retired.isEmpty else { return }
        queues.withLock { queues in queues.removeAll { retired.contains(ObjectIdentifier($0)) } }
    }

    /// Writes `chunk` whole (again after EINTR and short writes); after a failure, what was
    /// not written is dropped.
    private func writeWhole(_ chunk: [UInt8], to fd: Int32) {
        let (written, code) = chunk.withUnsafeBytes { raw -> (Int, Int32) in
            var offset = 0
            while offset < raw.count {
                let n = write(fd, raw.baseAddress! + offset, raw.count - offset)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return (offset, n < 0 ? errno : EIO) }
                offset += n
            }
            return (offset, 0)
        }
        if code == 0 {
            wroteAgain()
        } else {
            lost(chunk[written...], code: code)
        }
    }

    /// A write failed with `code`: what it did not write is dropped; the first failure of an
    /// episode is reported.
    private func lost(_ rest: ArraySlice<UInt8>, code: Int32) {
        let lines = rest.reduce(0) { $1 == UInt8(ascii: "\n") ? $0 + 1 : $0 }
        let first = failure.withLock { state -> Bool in
            if state == nil {
                state = WriteFailure(code: code, lostLines: lines, lostBytes: rest.count)
                return true
            }
            state!.lostLines += lines
            state!.lostBytes += rest.count
            return false
        }
        if first {
            Self.diagnostics.warning(
                "cannot write log \(path): \(String(cString: strerror(code))) (errno \(code)); its lines are dropped until a write succeeds (said once until then)"
            )
        }
    }

    /// A write succeeded: a failure episode, if one was going on, is over.
    private func wroteAgain() {
        guard
            let ended = failure.withLock({ state -> WriteFailure? in
                defer { state = nil }
                return state
            })
        else { return }
        Self.diagnostics.warning(
            "log \(path) is writing again; \(ended.lostLines) line(s) (\(ended.lostBytes) bytes) were lost while writes failed with \(String(cString: strerror(ended.code)))"
        )
    }

    /// Where a sink reports its own failures (the diagnostics on stderr, never a sink).
    private static let diagnostics = Logger(label: "sluice")

    /// Flushes every sink; for a clean exit.
    public static func flushAll() {
        let sinks = registry.withLock { Array($0.values) }
        for sink in sinks { sink.flush() }
    }
}

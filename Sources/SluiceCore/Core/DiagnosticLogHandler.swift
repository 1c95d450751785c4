import Logging
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// Sluice's swift-log handler for its diagnostics (warnings, reload errors, start and stop),
/// on standard error: `text` for a terminal (`sluice[PID] LEVEL: message key=value`) or
/// `json` for journald and log collectors (one object per line: `time`, `level`, `pid`,
/// `message`, then the metadata). Each line leaves in one `write(2)`, so lines from
/// different threads never interleave. `sluice run` bootstraps it; a library user's own
/// `LoggingSystem.bootstrap` takes precedence.
///
/// Threading: the format and level are process-wide atomics (`configure`), read on every
/// line; a handler value is otherwise immutable and may be used from any thread.
public struct DiagnosticLogHandler: LogHandler {
    public enum Format: String, Sendable, CaseIterable { case text, json }

    private static let format = Atomic<UInt8>(0)
    private static let level = Atomic<UInt8>(UInt8(Logger.Level.allCases.firstIndex(of: .info)!))

    /// Sets the format and the lowest level written, for every handler of the process
    /// (`log_format`, `log_level`; `SLUICE_LOG` overrides the level).
    public static func configure(format: Format, level: Logger.Level) {
        self.format.store(format == .json ? 1 : 0, ordering: .relaxed)
        self.level.store(UInt8(Logger.Level.allCases.firstIndex(of: level)!), ordering: .relaxed)
    }

    /// The level names of `log_level` and `SLUICE_LOG`.
    public static let levelNames: [String: Logger.Level] = ["debug": .debug, "info": .info, "warning": .warning, "error": .error]

    public static var currentFormat: Format { format.load(ordering: .relaxed) == 1 ? .json : .text }
    public static var currentLevel: Logger.Level { Logger.Level.allCases[Int(level.load(ordering: .relaxed))] }

    public var metadata: Logger.Metadata = [:]
    public var metadataProvider: Logger.MetadataProvider?

    public init(label: String) {}

    /// The level is the process's (`configure`): a `Logger` that sets its own changes nothing.
    public var logLevel: Logger.Level {
        get { Self.currentLevel }
        set {}
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var all = metadata
        if let provided = metadataProvider?.get() { all.merge(provided) { _, new in new } }
        if let given = event.metadata { all.merge(given) { _, new in new } }
        let line =
            Self.currentFormat == .json
            ? Self.jsonLine(event.level, "\(event.message)", all)
            : Self.textLine(event.level, "\(event.message)", all)
        line.withUnsafeBufferPointer { buf in
            var offset = 0
            while offset < buf.count {
                let n = write(2, buf.baseAddress! + offset, buf.count - offset)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { break }
                offset += n
            }
        }
    }

    /// `warning` for swift-log's `.warning`, and so on; `trace` and `critical` keep their names.
    static func name(_ level: Logger.Level) -> String { level.rawValue }

    static func textLine(_ level: Logger.Level, _ message: String, _ metadata: Logger.Metadata) -> [UInt8] {
        var line = "sluice[\(getpid())] \(name(level)): \(message)"
        for (key, value) in metadata.sorted(by: { $0.key < $1.key }) { line += " \(key)=\(value)" }
        line += "\n"
        return Array(line.utf8)
    }

    static func jsonLine(_ level: Logger.Level, _ message: String, _ metadata: Logger.Metadata) -> [UInt8] {
        var json = JSONLine()
        json.timestamp("time")
        json.field("level", name(level))
        json.field("pid", Int(getpid()))
        json.field("message", message)
        for (key, value) in metadata.sorted(by: { $0.key < $1.key }) { json.field(named: key, "\(value)") }
        return json.finishBytes()
    }
}

#if canImport(Glibc)
import Glibc
#endif

/// Diagnostics on standard error, one line per call, written with a single `write(2)` so
/// lines from different worker threads never interleave. Stateless, hence safe anywhere.
public enum Log {
    public enum Level: Int, Sendable, Comparable {
        case debug, info, warning, error
        public static func < (a: Level, b: Level) -> Bool { a.rawValue < b.rawValue }
        var label: String {
            switch self {
            case .debug: return "debug"
            case .info: return "info"
            case .warning: return "warning"
            case .error: return "error"
            }
        }
    }

    /// `info` unless `SLUICE_LOG=debug|info|warning|error` says otherwise; read once.
    public static let threshold: Level = {
        guard let raw = getenv("SLUICE_LOG") else { return .info }
        switch String(cString: raw) {
        case "debug": return .debug
        case "warning": return .warning
        case "error": return .error
        default: return .info
        }
    }()

    public static func write(_ level: Level, _ message: @autoclosure () -> String) {
        guard level >= threshold else { return }
        var line = "sluice[\(getpid())] \(level.label): \(message())\n"
        line.withUTF8 { buf in
            var offset = 0
            while offset < buf.count {
                let n = Glibc.write(2, buf.baseAddress! + offset, buf.count - offset)
                if n <= 0 { break }
                offset += n
            }
        }
    }

    public static func debug(_ m: @autoclosure () -> String) { write(.debug, m()) }
    public static func info(_ m: @autoclosure () -> String) { write(.info, m()) }
    public static func warning(_ m: @autoclosure () -> String) { write(.warning, m()) }
    public static func error(_ m: @autoclosure () -> String) { write(.error, m()) }
}

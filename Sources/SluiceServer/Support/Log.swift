import Logging
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// Sluice's diagnostics (not the access log): one swift-log `Logger` labelled `sluice`.
/// Where its lines go is the process's `LoggingSystem` choice — `sluice run` bootstraps
/// `DiagnosticLogHandler` (text or JSON on standard error, `log_format`/`log_level`); a
/// library user's own bootstrap wins. Messages are built only when their level is written.
///
/// Threading: a `Logger` is a value; the shared one is immutable and safe from any thread.
public enum Log {
    public static let logger = Logger(label: "sluice")

    /// Applies `log_format` and `log_level` to `DiagnosticLogHandler` (at start and at every
    /// reload). `SLUICE_LOG=debug|info|warning|error` in the environment overrides the level.
    public static func apply(_ server: ServerConfiguration) {
        var level = server.logLevel
        if let raw = getenv("SLUICE_LOG"), let named = DiagnosticLogHandler.levelNames[String(cString: raw)] {
            level = named
        }
        DiagnosticLogHandler.configure(format: server.logFormat, level: level)
    }

    public static func debug(_ m: @autoclosure () -> String) { logger.debug("\(m())") }
    public static func info(_ m: @autoclosure () -> String) { logger.info("\(m())") }
    public static func warning(_ m: @autoclosure () -> String) { logger.warning("\(m())") }
    public static func error(_ m: @autoclosure () -> String) { logger.error("\(m())") }
}

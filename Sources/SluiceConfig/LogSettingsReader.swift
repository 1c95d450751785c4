import Logging
import SluiceCore

/// `log_format: text | json` and `log_level: debug | info | warning | error` (docs/configuration.md,
/// "Diagnostics"): how Sluice's own diagnostics are written (`DiagnosticLogHandler`). Both
/// apply at start and at every reload.
extension NodeReader {
    mutating func readLogFormat(_ node: YAMLNode, into format: inout DiagnosticLogHandler.Format) {
        guard let text = node.scalar?.string, let value = DiagnosticLogHandler.Format(rawValue: text) else {
            return fail(node, "log_format must be text or json")
        }
        format = value
    }

    mutating func readLogLevel(_ node: YAMLNode, into level: inout Logger.Level) {
        guard let text = node.scalar?.string, let value = DiagnosticLogHandler.levelNames[text] else {
            return fail(node, "log_level must be debug, info, warning or error")
        }
        level = value
    }
}

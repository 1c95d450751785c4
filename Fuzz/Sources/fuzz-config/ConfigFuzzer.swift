import FuzzSupport

@testable import SluiceConfig

/// Fuzz target: `ConfigLoader`, from YAML text (its `YAMLReader` included) to a validated
/// configuration. Monitors' log files are checked but not opened (`logSinks: .skip`), so a
/// run creates no file; secret and certificate files the input names are read, so run it in
/// a scratch directory.
///
/// Checks, beyond "no crash, no hang": any input gives a configuration or a `ConfigError`
/// (never another error), and that error lists at least one issue, each located in the file
/// at a line and column from 1 and with a message.
@main
enum ConfigFuzzer {
    static func main() {
        FuzzDriver.run { data, count in ConfigFuzzer.testOneInput(FuzzDriver.bytes(data, count)) }
    }

    /// One input: returns 0, or traps on a finding.
    static func testOneInput(_ raw: UnsafeRawBufferPointer) -> Int32 {
        let yaml = String(decoding: raw, as: UTF8.self)
        do {
            _ = try ConfigLoader.parse(yaml: yaml, file: "fuzz.yaml", logSinks: .skip)
        } catch let error as ConfigError {
            fuzzCheck(!error.issues.isEmpty, "a ConfigError without issues")
            for issue in error.issues {
                fuzzCheck(issue.file == "fuzz.yaml" && !issue.message.isEmpty, "issue without file or message: \(issue)")
                fuzzCheck(issue.line >= 1 && issue.column >= 1, "issue without a location: \(issue)")
            }
        } catch {
            fuzzCheck(false, "not a ConfigError: \(error)")
        }
        return 0
    }
}

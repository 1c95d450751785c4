import CLibFuzzer
import Glibc

/// Runs libFuzzer's driver with this process's arguments and exits with its status.
///
/// A SwiftPM executable always has a `main` of its own (libFuzzer's would otherwise be the
/// entry point), so each target's `@main` calls this with its one-input function:
/// a capture-free closure that must return 0 and trap on any finding.
public enum FuzzDriver {
    public typealias TestOneInput = @convention(c) (UnsafePointer<UInt8>?, Int) -> Int32

    public static func run(_ testOneInput: TestOneInput) -> Never {
        var argc = CommandLine.argc
        var argv = CommandLine.unsafeArgv
        let status = withUnsafeMutablePointer(to: &argv) { argvPointer in
            argvPointer.withMemoryRebound(to: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?.self, capacity: 1) {
                LLVMFuzzerRunDriver(&argc, $0, testOneInput)
            }
        }
        exit(status)
    }

    /// The input as a buffer (libFuzzer passes a null pointer for the empty input).
    public static func bytes(_ data: UnsafePointer<UInt8>?, _ count: Int) -> UnsafeRawBufferPointer {
        UnsafeRawBufferPointer(start: data, count: data == nil ? 0 : count)
    }
}

/// Stops the run with `message` when `condition` is false: libFuzzer records the input as a
/// crash. (`precondition` would be compiled out in -Ounchecked; this never is.)
@inline(never)
public func fuzzCheck(
    _ condition: @autoclosure () -> Bool, _ message: @autoclosure () -> String,
    file: StaticString = #fileID, line: UInt = #line
) {
    if !condition() { fatalError("fuzz finding: \(message())", file: file, line: line) }
}

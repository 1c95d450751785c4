import Foundation
import Testing

@testable import SluiceCore

/// A `LogSink` keeps a buffer only as long as a monitor writes to it: a retired buffer's last
/// lines are written and the buffer dropped (a reload under load used to leave every retired
/// buffer's capacity behind), and an idle buffer gives its capacity back.
@Suite struct LogSinkTests {
    /// A sink on a file of its own, and the file's path.
    private func sink() throws -> (LogSink, String) {
        let path = FileManager.default.temporaryDirectory
            .appendingPathComponent("sluice-sink-\(UInt64.random(in: 0 ... .max)).log").path
        return (try LogSink.shared(path: path), path)
    }

    @Test func aRetiredBufferIsWrittenThenDropped() throws {
        let (sink, path) = try sink()
        defer { try? FileManager.default.removeItem(atPath: path) }
        let kept = sink.makeBuffer()
        var retired: LogSink.Buffer? = sink.makeBuffer()
        kept.append("kept\n")
        retired?.append("last line of a retired buffer\n")
        retired = nil
        sink.flush()
        let lines = try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n")
        #expect(Set(lines) == ["kept", "last line of a retired buffer"])
        #expect(sink.bufferCount == 1)
        kept.append("after\n")
        sink.flush()
        #expect(try String(contentsOfFile: path, encoding: .utf8).hasSuffix("after\n"))
    }

    @Test func anIdleBufferGivesItsCapacityBack() throws {
        let (sink, path) = try sink()
        defer { try? FileManager.default.removeItem(atPath: path) }
        let buffer = sink.makeBuffer()
        let line = String(repeating: "x", count: 100_000) + "\n"
        buffer.append(line)
        // The first flush (this one or the writer thread's) writes the line; any later one
        // finds the buffer idle.
        sink.flush()
        sink.flush()
        #expect(sink.bufferCapacity == 0)
        buffer.append("again\n")
        sink.flush()
        #expect(try String(contentsOfFile: path, encoding: .utf8) == line + "again\n")
    }
}

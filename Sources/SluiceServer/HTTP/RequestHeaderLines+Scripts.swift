import HTTPTypes
import SluiceCore

/// The forwarded request's lines as the policy's scripts see them (`HostPolicy.scriptsOnLines`):
/// every line but the last, which is Sluice's `Via` (`ForwardedHeaders.requestLines` ends with
/// it) and no field of the client's. Immutable once built, so they may be handed across
/// threads, though they never leave their worker.
extension RequestHeaderLines: LuaHeaderLines, @unchecked Sendable {
    func forEachScriptField(_ body: (_ name: UnsafeBufferPointer<UInt8>, _ value: UnsafeBufferPointer<UInt8>) -> Void) {
        var left = count - 1
        forEachField { name, value in
            guard left > 0 else { return }
            left -= 1
            body(name, value)
        }
    }

    /// Each line but `Via` is checked for `name` and its colon where the name would end, with
    /// no search for the colon: a `get` costs a compare or two per line.
    func forEachScriptValue(named name: UnsafeRawBufferPointer, _ body: (_ value: UnsafeBufferPointer<UInt8>) -> Void) {
        let n = name.count
        guard n > 0 else { return }
        withBytes { bytes, ends in
            guard let base = bytes.baseAddress else { return }
            var start = 0
            for i in 0..<max(0, ends.count - 1) {
                let next = ends[i]
                let end = next - 2
                if Self.line(bytes, start, end, isNamed: name) {
                    // The builder put one SP after the colon before a value, none before an empty one.
                    let valueStart = min(start + n + 2, end)
                    body(UnsafeBufferPointer(start: base + valueStart, count: end - valueStart))
                }
                start = next
            }
        }
    }

    /// Whether the line `bytes[start..<end]` (no CRLF) is a field named `name` (any case).
    /// Most lines are told apart by where their colon is, before any byte is compared; the
    /// name's bytes are then read through a pointer (the line's length was checked once, no
    /// bounds check per byte).
    @inline(__always)
    private static func line(
        _ bytes: UnsafeBufferPointer<UInt8>, _ start: Int, _ end: Int, isNamed name: UnsafeRawBufferPointer
    ) -> Bool {
        let n = name.count
        guard n > 0, end - start > n, bytes[start + n] == 0x3A, let base = bytes.baseAddress else { return false }
        let line = base + start
        for j in 0..<n where line[j] != name[j] {
            if ASCII.lower(line[j]) != ASCII.lower(name[j]) { return false }
        }
        return true
    }

    /// These lines (the last Sluice's `Via`) with the scripts' `edits` made
    /// (`LuaRequestView.lineEdits`, bytes), composed as `HeaderEditPlan` composes adapters': the
    /// fields a `set` or `remove` names are dropped, the fields the edits leave follow (those
    /// a forwarded request never carries left out, as from a request model), then `Via`.
    /// Built in `builder` (the worker's); the lines kept are copied a run at a time, or not at
    /// all when the builder still holds these lines (it made them, just before the scripts
    /// ran) and no line is dropped: only `Via` moves to the end. Nothing is composed first: a
    /// script makes an edit or two.
    func applying(_ edits: LuaLineEdits, builder: inout Builder) -> RequestHeaderLines {
        edits.withEntries { edits in
            withBytes { bytes, ends in
                let via = ends.count - 1
                withUnsafeTemporaryAllocation(of: Bool.self, capacity: max(via, 1)) { dropped in
                    dropped.initialize(repeating: false)
                    var anyDropped = false
                    for edit in edits where edit.replaces {
                        let key = UnsafeRawBufferPointer(edit.name)
                        var start = 0
                        for i in 0..<via {
                            if Self.line(bytes, start, ends[i] - 2, isNamed: key) {
                                dropped[i] = true
                                anyDropped = true
                            }
                            start = ends[i]
                        }
                    }
                    if !anyDropped, builder.holds(bytes, lines: ends.count) {
                        builder.removeLastLine()
                        return
                    }
                    builder.reset()
                    var run = 0
                    for i in 0..<via where dropped[i] {
                        builder.append(lines: self, run..<i)
                        run = i + 1
                    }
                    builder.append(lines: self, run..<via)
                }
            }
            for (i, edit) in edits.enumerated() where edit.operation != .remove {
                // A later `set` or `remove` of the name drops it.
                let name = UnsafeRawBufferPointer(edit.name)
                if edits[(i + 1)...].contains(where: { $0.replaces && LuaLineEdits.same($0.name, name) }) { continue }
                guard !ForwardedHeaders.isDroppedRequestField(edit.name) else { continue }
                builder.append(name: edit.name, value: edit.value)
            }
        }
        builder.append(lines: self, (count - 1)..<count)
        return builder.makeLines()
    }
}

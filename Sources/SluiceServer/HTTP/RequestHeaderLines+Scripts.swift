import SluiceCore

/// The forwarded request's lines as the policy's scripts see them (`HostPolicy.scriptsOnLines`):
/// the worker's builder holding them (`ForwardedHeaders.fieldLines`), before Sluice's `Via`
/// is added and before they are made into `RequestHeaderLines`. Scripts read them where they
/// were built, and their edits are made in the same builder (`finishScripted`): the lines are
/// made once, with the edits and `Via`, and copied only when an edit drops some of them.
///
/// A view (`LuaRequestView.lines`) holds a copy of the builder, which shares its buffers
/// until either changes; the stage lets the view's copy go before it finishes the builder,
/// so the buffers are not copied then either.
///
/// Threading: built and read on one worker's thread (a view never leaves it).
extension RequestHeaderLines.Builder: LuaHeaderLines {
    func forEachScriptField(_ body: (_ name: UnsafeBufferPointer<UInt8>, _ value: UnsafeBufferPointer<UInt8>) -> Void) {
        withLines { RequestHeaderLines.forEachField(in: $0, ending: $1, body) }
    }

    /// Each line is checked for `name` and its colon where the name would end, with no search
    /// for the colon: a `get` costs a compare or two per line.
    func forEachScriptValue(named name: UnsafeRawBufferPointer, _ body: (_ value: UnsafeBufferPointer<UInt8>) -> Void) {
        let n = name.count
        guard n > 0 else { return }
        withLines { bytes, ends in
            guard let base = bytes.baseAddress else { return }
            var start = 0
            for i in 0..<ends.count {
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
    /// name's bytes are then compared as the edits' names are (`LuaLineEdits.same`).
    @inline(__always)
    private static func line(
        _ bytes: UnsafeBufferPointer<UInt8>, _ start: Int, _ end: Int, isNamed name: UnsafeRawBufferPointer
    ) -> Bool {
        let n = name.count
        guard n > 0, end - start > n, bytes[start + n] == 0x3A, let base = bytes.baseAddress else { return false }
        return LuaLineEdits.same(UnsafeBufferPointer(start: base + start, count: n), name)
    }

    /// The lines the builder holds with the scripts' `edits` made (`LuaRequestView.lineEdits`)
    /// and `viaLine` last, made: composed as `HeaderEditPlan` composes adapters' — the lines a
    /// `set` or `remove` names are dropped, the fields the edits leave follow (those a
    /// forwarded request never carries left out, as from a request model), then `Via`. An
    /// edit that drops no line (nearly every `set` of a script: a field the request lacks)
    /// only appends to the builder; one that drops lines copies those kept, a run at a time.
    mutating func finishScripted(_ edits: LuaLineEdits, viaLine: [UInt8]) -> RequestHeaderLines {
        if !edits.isEmpty {
            edits.withEntries { edits in
                dropReplaced(by: edits)
                for (i, edit) in edits.enumerated() where edit.operation != .remove {
                    // A later `set` or `remove` of the name drops it.
                    let name = UnsafeRawBufferPointer(edit.name)
                    if edits[(i + 1)...].contains(where: { $0.replaces && LuaLineEdits.same($0.name, name) }) { continue }
                    guard !ForwardedHeaders.isDroppedRequestField(edit.name) else { continue }
                    append(name: edit.name, value: edit.value)
                }
            }
        }
        append(line: viaLine)
        return makeLines()
    }

    /// Drops the lines whose fields a `set` or a `remove` of `edits` names.
    private mutating func dropReplaced(by edits: UnsafeBufferPointer<LuaLineEdits.Entry>) {
        guard edits.contains(where: \.replaces) else { return }
        let count = lineCount
        withUnsafeTemporaryAllocation(of: Bool.self, capacity: max(count, 1)) { dropped in
            dropped.initialize(repeating: false)
            var anyDropped = false
            withLines { bytes, ends in
                for edit in edits where edit.replaces {
                    let key = UnsafeRawBufferPointer(edit.name)
                    var start = 0
                    for i in 0..<count {
                        if Self.line(bytes, start, ends[i] - 2, isNamed: key) {
                            dropped[i] = true
                            anyDropped = true
                        }
                        start = ends[i]
                    }
                }
            }
            guard anyDropped else { return }
            let kept = makeLines()
            reset()
            var run = 0
            for i in 0..<count where dropped[i] {
                append(lines: kept, run..<i)
                run = i + 1
            }
            append(lines: kept, run..<count)
            recountHost()
        }
    }
}

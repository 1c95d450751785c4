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
            var start = 0
            for i in 0..<max(0, ends.count - 1) {
                let end = ends[i] - 2
                defer { start = ends[i] }
                guard end - start > n, bytes[start + n] == 0x3A else { continue }
                var same = true
                for j in 0..<n where bytes[start + j] != name[j] {
                    if ASCII.lower(bytes[start + j]) != ASCII.lower(name[j]) {
                        same = false
                        break
                    }
                }
                guard same else { continue }
                // The builder put one SP after the colon before a value, none before an empty one.
                let valueStart = min(start + n + 2, end)
                body(UnsafeBufferPointer(rebasing: bytes[valueStart..<end]))
            }
        }
    }

    /// These lines (the last Sluice's `Via`) with the scripts' `edits` made
    /// (`LuaRequestView.lineEdits`), composed as `HeaderEditPlan` composes adapters': the
    /// fields a `set` or `remove` names are dropped, the fields the edits leave follow (those
    /// a forwarded request never carries left out, as from a request model), then `Via`.
    /// Built in `builder` (the worker's); the lines kept are copied a run at a time.
    func applying(_ edits: [HeaderEdit], builder: inout Builder) -> RequestHeaderLines {
        var removed: [HTTPField.Name] = []
        var appended: [(name: HTTPField.Name, value: String)] = []
        for edit in edits {
            switch edit {
            case .add(let name, let value):
                appended.append((name, value))
            case .remove(let name), .set(let name, _):
                appended.removeAll { $0.name == name }
                if !removed.contains(name) { removed.append(name) }
                if case .set(_, let value) = edit { appended.append((name, value)) }
            }
        }
        builder.reset()
        let via = count - 1
        var run = 0
        var index = 0
        if !removed.isEmpty {
            forEachScriptField { name, _ in
                if removed.contains(where: { ASCII.equalsIgnoringCase(name, $0.canonicalName) }) {
                    builder.append(lines: self, run..<index)
                    run = index + 1
                }
                index += 1
            }
        }
        builder.append(lines: self, run..<via)
        for (field, value) in appended {
            var fieldName = field.rawName
            fieldName.withUTF8 { fieldName in
                if !ForwardedHeaders.isDroppedRequestField(fieldName) { builder.append(name: fieldName, value: value.utf8) }
            }
        }
        builder.append(lines: self, via..<count)
        return builder.makeLines()
    }
}

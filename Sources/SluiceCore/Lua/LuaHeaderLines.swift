import HTTPTypes

/// A request's header fields as the lines the pipeline forwards upstream, which a script reads
/// and edits without their being built as `HTTPFields` first (`HostPolicy.scriptsOnLines`): a
/// `req.headers:get` scans them, a `set`, `add` or `remove` is recorded in
/// `LuaRequestView.lineEdits`, and the engine makes those edits where the lines are built
/// (copying them only when an edit drops some). Any other use of the headers (`get_all`,
/// `each`, a `get` of a field a script edited) builds the fields first
/// (`LuaRequestView.materializeHeaders`), with the same result as if they had been fields all
/// along.
///
/// Threading: made and read on the exchange's worker thread; a script only reads the lines
/// (the engine's are a copy of the worker's line builder, which shares its buffers).
public protocol LuaHeaderLines: Sendable {
    /// Calls `body` with each field's name and value bytes, in order.
    func forEachScriptField(_ body: (_ name: UnsafeBufferPointer<UInt8>, _ value: UnsafeBufferPointer<UInt8>) -> Void)
    /// Calls `body` with the value bytes of each field named `name` (ASCII, any case), in order.
    /// (`mutating` though it changes nothing: called on the view's `lines` in place, where a
    /// non-mutating call copied the existential out of its optional first, ~190 instructions.)
    mutating func forEachScriptValue(named name: UnsafeRawBufferPointer, _ body: (_ value: UnsafeBufferPointer<UInt8>) -> Void)
}

extension LuaRequestView {
    /// Builds `headers` from `lines` and `lineEdits`, applied in order as `HTTPFields` would
    /// have them; nothing when `headers` holds the fields already.
    public mutating func materializeHeaders() {
        guard let lines else { return }
        var fields = HTTPFields()
        lines.forEachScriptField { name, value in
            guard let name = HTTPField.Name(String(decoding: name, as: UTF8.self)) else { return }
            fields.append(HTTPField(name: name, lenientValue: value))
        }
        lineEdits.withEntries { edits in
            for edit in edits {
                // Checked when recorded: a name is a token, a value one `HTTPField` keeps.
                guard let name = HTTPField.Name(String(decoding: edit.name, as: UTF8.self)) else { continue }
                let value = String(decoding: edit.value, as: UTF8.self)
                switch edit.operation {
                case .remove: fields[fields: name] = []
                case .set: fields[fields: name] = [HTTPField(name: name, value: value)]
                case .add: fields.append(HTTPField(name: name, value: value))
                }
            }
        }
        headers = fields
        self.lines = nil
        hasLines = false
        lineEdits = LuaLineEdits()
    }
}

import CLua
import HTTPTypes

/// `req`, `res` and their `headers` as Lua sees them: userdata naming a call slot, whose
/// metamethods and methods are Swift functions reading and editing the slot's
/// `LuaRequestView` / `LuaResponseView`. Nothing is copied into Lua until the script asks for
/// it: reading one header costs one lookup, not a table of every header.
///
/// - `req.method`, `req.path`, `req.query` (read and write), `req.headers`; `req:body()`,
///   `req:set_body(s)`, `req:respond(status, headers, body)`.
/// - `res.status` (read), `res.headers`; `res:body()`, `res:set_body(s)`, `res:retry()`.
/// - `headers:get(name)` (values joined with ", ", or nil), `get_all(name)` (a list),
///   `set(name, value)` (replaces; nil removes), `add(name, value)`, `remove(name)`,
///   `each()` (`for name, value in h:each() do`). Names are case-insensitive; a value with CR,
///   LF or NUL is refused with an error naming the header.
///
/// Threading: the state's thread, inside `lua_resume` (see `Lua` for the error discipline).
enum LuaMessageAPI {
    /// The payload of every message userdata: the slot's index and which message.
    struct Handle {
        var slot: Int32
        /// 0: the request; 1: the response.
        var kind: Int32
    }

    /// Makes the tables every slot's userdata share: the methods of `req` and of `res`, and
    /// the metatable of `headers` (whose `__index` is its methods table).
    static func makeMetatables(_ state: LuaState) {
        let L = state.L
        state.requestMethodsRef = methods(L, [("body", requestBody), ("set_body", requestSetBody), ("respond", respond)])
        state.responseMethodsRef = methods(L, [("body", responseBody), ("set_body", responseSetBody), ("retry", retry)])
        lua_createtable(L, 0, 3)
        Lua.push(L, "__index")
        lua_rawgeti(
            L, Lua.registry,
            lua_Integer(
                methods(
                    L,
                    [
                        ("get", headerGet), ("get_all", headerGetAll), ("set", headerSet), ("add", headerAdd),
                        ("remove", headerRemove), ("each", headerEach),
                    ])))
        lua_rawset(L, -3)
        Lua.push(L, function: headersNewIndex)
        lua_setfield(L, -2, "__newindex")
        lua_pushboolean(L, 0)
        lua_setfield(L, -2, "__metatable")
        state.headersMetaRef = luaL_ref(L, Lua.registry)
    }

    private static func methods(_ L: OpaquePointer, _ functions: [(String, Lua.Function)]) -> Int32 {
        lua_createtable(L, 0, Int32(functions.count))
        for (name, f) in functions {
            Lua.push(L, function: f)
            lua_setfield(L, -2, name)
        }
        return luaL_ref(L, Lua.registry)
    }

    /// A slot with its `req` and `res` userdata. Each message has a metatable of its own whose
    /// `__index` is a table of the slot's: its `headers` userdata and the methods, found by the
    /// VM without calling Swift; only the fields that change per call (`method`, `path`,
    /// `query`, `status`) fall through to a Swift function, which knows its slot by upvalue.
    static func makeSlot(_ state: LuaState, index: Int32) -> LuaCallSlot {
        let L = state.L
        func message(
            kind: Int32, methods: Int32, field: Lua.Function, newIndex: Lua.Function
        ) -> (Int32, UnsafeMutableRawPointer, UnsafeMutableRawPointer) {
            let ud = userdata(L, Handle(slot: index, kind: kind))
            // The index table: methods, headers; its own __index answers the per-call fields.
            lua_createtable(L, 0, 4)
            lua_rawgeti(L, Lua.registry, lua_Integer(methods))
            lua_pushnil(L)
            while lua_next(L, -2) != 0 {
                lua_pushvalue(L, -2)
                sluice_lua_insert(L, -2)
                lua_rawset(L, -5)
            }
            sluice_lua_pop(L, 1)
            Lua.push(L, "headers")
            let headers = userdata(L, Handle(slot: index, kind: kind))
            lua_rawgeti(L, Lua.registry, lua_Integer(state.headersMetaRef))
            _ = lua_setmetatable(L, -2)
            lua_rawset(L, -3)
            lua_createtable(L, 0, 1)
            lua_pushinteger(L, lua_Integer(index))
            Lua.push(L, function: field, upvalues: 1)
            lua_setfield(L, -2, "__index")
            _ = lua_setmetatable(L, -2)
            // The message's metatable.
            lua_createtable(L, 0, 3)
            sluice_lua_insert(L, -2)
            lua_setfield(L, -2, "__index")
            Lua.push(L, function: newIndex)
            lua_setfield(L, -2, "__newindex")
            lua_pushboolean(L, 0)
            lua_setfield(L, -2, "__metatable")
            _ = lua_setmetatable(L, -2)
            return (luaL_ref(L, Lua.registry), ud, headers)
        }
        let request = message(kind: 0, methods: state.requestMethodsRef, field: requestField, newIndex: requestNewIndex)
        let response = message(kind: 1, methods: state.responseMethodsRef, field: responseField, newIndex: responseNewIndex)
        return LuaCallSlot(
            index: index, requestRef: request.0, responseRef: response.0,
            userdata: (request.1, response.1, request.2, response.2))
    }

    private static func userdata(_ L: OpaquePointer, _ handle: Handle) -> UnsafeMutableRawPointer {
        let ud = sluice_lua_newuserdata(L, MemoryLayout<Handle>.size, 0)!
        ud.storeBytes(of: handle, as: Handle.self)
        return ud
    }

    // MARK: Finding the call

    /// Which userdata a function expects as `self`.
    enum Role: Int {
        case request = 0, response, requestHeaders, responseHeaders
    }

    /// The slot of the userdata at `index` if it is that slot's `role` userdata (scripts cannot
    /// make userdata, so any they pass is one of ours: the payload names a slot, and the slot
    /// confirms by address) and its call is the one running (`state.current`), in the hook it
    /// belongs to. Not another call's: a script may keep a `req` in a table of its top level,
    /// and a call that waits leaves its slot in its phase, which another exchange's call
    /// (another policy's, with another `config`) must not read or answer.
    private static func slot(_ L: OpaquePointer?, _ state: LuaState, _ index: Int32, _ role: Role) -> LuaCallSlot? {
        // Every userdata a script can reach is at least a handle's size (a metric counter is
        // made as large, `LuaMetricAPI`); a light one is `json.null`, whose address is nil.
        guard let payload = lua_touserdata(L, index) else { return nil }
        let handle = payload.load(as: Handle.self)
        guard handle.slot >= 0, Int(handle.slot) < state.slots.count else { return nil }
        let slot = state.slots[Int(handle.slot)]
        let own =
            switch role {
            case .request: slot.userdata.0
            case .response: slot.userdata.1
            case .requestHeaders: slot.userdata.2
            case .responseHeaders: slot.userdata.3
            }
        guard own == payload, slot === state.current, slot.phase == (handle.kind == 0 ? .request : .response) else {
            return nil
        }
        return slot
    }

    /// The slot named by upvalue 2 of a field function, if its call is the one running, in
    /// `phase`.
    private static func slot(_ L: OpaquePointer?, _ state: LuaState, upvalueFor phase: LuaCallSlot.Phase) -> LuaCallSlot? {
        guard let index = Lua.integer(L, Lua.upvalue(2)), index < state.slots.count else { return nil }
        let slot = state.slots[index]
        return slot === state.current && slot.phase == phase ? slot : nil
    }

    private static func outsideCall(_ L: OpaquePointer?, _ what: String) -> Int32 {
        Lua.fail(L, "\(what) used outside its call (or on something else)")
    }

    // MARK: req

    /// `req.method`, `req.path`, `req.query` (other keys: nil).
    private static let requestField: Lua.Function = { L in
        let state = LuaState.of(L)
        guard let key = Lua.bytes(L, 2) else {
            lua_pushnil(L)
            return 1
        }
        guard let slot = slot(L, state, upvalueFor: .request) else { return outsideCall(L, "req") }
        if Lua.equals(key, "method") {
            Lua.push(L, slot.request.method)
        } else if Lua.equals(key, "path") {
            Lua.push(L, slot.request.path)
        } else if Lua.equals(key, "query"), let query = slot.request.query {
            Lua.push(L, query)
        } else {
            lua_pushnil(L)
        }
        return 1
    }

    private static let requestNewIndex: Lua.Function = { L in
        let state = LuaState.of(L)
        guard let slot = slot(L, state, 1, .request) else { return outsideCall(L, "req") }
        let key = Lua.bytes(L, 2).map { Lua.printable($0) } ?? "?"
        if key == "query" && lua_type(L, 3) == LUA_TNIL {
            slot.request.query = nil
            return 0
        }
        guard let value = Lua.text(L, 3) else { return Lua.fail(L, "req.\(key) must be a string") }
        switch key {
        case "method":
            guard !value.isEmpty, value.allSatisfy(isTokenByte) else {
                return Lua.fail(L, "req.method '\(Lua.printable(value))' is not a method name")
            }
            let method = Lua.makeString(value)
            // The client frames the answer by the method it sent: a HEAD's answer has no body
            // whatever its Content-Length says, any other's has one. A request made a HEAD (or
            // no longer one) would be answered with a body the client does not read, or without
            // one it waits for; CONNECT would ask the origin for a tunnel.
            let upper = method.uppercased()
            let head = upper == "HEAD"
            // Any case of either name is refused as the name itself (methods are
            // case-sensitive, but an origin may read `head` as `HEAD`).
            if head != (slot.request.method == "HEAD") || (head && method != "HEAD") || upper == "CONNECT" {
                return Lua.fail(
                    L,
                    "req.method cannot change \(slot.request.method) to \(Lua.printable(value)) (not to or from HEAD, nor to CONNECT)"
                )
            }
            slot.request.method = method
        case "path":
            guard value.first == UInt8(ascii: "/"), value.allSatisfy(isTargetByte), !value.contains(UInt8(ascii: "?")) else {
                return Lua.fail(
                    L,
                    "req.path '\(Lua.printable(value))' must start with / and hold visible ASCII only, no ? or # (percent-encode the rest)"
                )
            }
            slot.request.path = Lua.makeString(value)
        case "query":
            guard value.allSatisfy(isTargetByte) else {
                return Lua.fail(
                    L, "req.query '\(Lua.printable(value))' must hold visible ASCII only, no # (percent-encode the rest)")
            }
            slot.request.query = Lua.makeString(value)
        default:
            return Lua.fail(L, "req.\(key) cannot be set (method, path and query can)")
        }
        return 0
    }

    private static let requestBody: Lua.Function = { L in body(L, .request, "req", \.request.body) }

    /// Refused without `read_body: true`: the body then streams past the script, unread.
    private static let requestSetBody: Lua.Function = { L in
        if let slot = slot(L, LuaState.of(L), 1, .request), slot.request.body == nil {
            return Lua.fail(L, "req:set_body needs read_body: true (without it the body is streamed, never read)")
        }
        return setBody(L, .request, "req", \.request.body)
    }

    private static let respond: Lua.Function = { L in
        let state = LuaState.of(L)
        guard let slot = slot(L, state, 1, .request) else { return outsideCall(L, "req") }
        guard let status = Lua.integer(L, 2), (200...599).contains(status) else {
            return Lua.fail(L, "bad argument #1 to 'respond' (a final status from 200 to 599 expected)")
        }
        var headers = HTTPFields()
        // The fields' bytes, counted against the memory cap as they are copied: a table may
        // name one long string many times.
        var held = 0
        switch lua_type(L, 3) {
        case LUA_TNIL, LUA_TNONE: break
        case LUA_TTABLE:
            lua_pushnil(L)
            while lua_next(L, 3) != 0 {
                guard let name = headerName(L, -2) else { return Lua.failure }
                if lua_type(L, -1) == LUA_TTABLE {
                    let count = Int(lua_rawlen(L, -1))
                    for i in 0..<count {
                        lua_rawgeti(L, -1, lua_Integer(i + 1))
                        held += heldPerField + name.rawName.utf8.count + Int(lua_rawlen(L, -1))
                        guard Lua.fitsCall(L, held) else { return Lua.failMemory(L) }
                        guard let field = headerField(L, name, -1) else { return Lua.failure }
                        headers.append(field)
                        sluice_lua_pop(L, 1)
                    }
                } else {
                    held += heldPerField + name.rawName.utf8.count + Int(lua_rawlen(L, -1))
                    guard Lua.fitsCall(L, held) else { return Lua.failMemory(L) }
                    guard let field = headerField(L, name, -1) else { return Lua.failure }
                    headers.append(field)
                }
                sluice_lua_pop(L, 1)
            }
        default: return Lua.badArgument(L, 3, "respond", "table")
        }
        if let framing = headers.first(where: { isFramingField($0.name) }) {
            return Lua.fail(L, "req:respond cannot set '\(framing.name.rawName)' (Sluice frames the answer itself)")
        }
        var body: [UInt8]? = nil
        if lua_type(L, 4) > LUA_TNIL {
            switch readBody(L, 4, slot, "respond") {
            case .failure(let failed): return failed.code
            case .success(let bytes): body = bytes
            }
        }
        slot.respond = LuaResponseView(status: status, headers: headers, body: body)
        return 0
    }

    // MARK: res

    /// `res.status` (other keys: nil).
    private static let responseField: Lua.Function = { L in
        let state = LuaState.of(L)
        guard let key = Lua.bytes(L, 2), Lua.equals(key, "status") else {
            lua_pushnil(L)
            return 1
        }
        guard let slot = slot(L, state, upvalueFor: .response) else { return outsideCall(L, "res") }
        lua_pushinteger(L, lua_Integer(slot.response.status))
        return 1
    }

    private static let responseNewIndex: Lua.Function = { L in
        let key = Lua.bytes(L, 2).map { Lua.printable($0) } ?? "?"
        return Lua.fail(L, "res.\(key) cannot be set (change headers with res.headers, the body with res:set_body)")
    }

    private static let responseBody: Lua.Function = { L in body(L, .response, "res", \.response.body) }

    /// Refused without `read_response_body: true`: the body then streams past the script, unread.
    private static let responseSetBody: Lua.Function = { L in
        if let slot = slot(L, LuaState.of(L), 1, .response) {
            if slot.response.body == nil {
                return Lua.fail(L, "res:set_body needs read_response_body: true (without it the body is streamed, never read)")
            }
            // A part of a representation: its `Content-Range` would not describe another body,
            // and a client that joins parts would join this one.
            if slot.response.status == 206 {
                return Lua.fail(L, "res:set_body cannot replace a 206's body (a part of a representation, by its Content-Range)")
            }
        }
        return setBody(L, .response, "res", \.response.body)
    }

    private static let retry: Lua.Function = { L in
        let state = LuaState.of(L)
        guard let slot = slot(L, state, 1, .response) else { return outsideCall(L, "res") }
        slot.retry = true
        return 0
    }

    // MARK: Bodies

    /// `req:body()` and `res:body()`: the body of the message `role` names (`what` in errors).
    private static func body(
        _ L: OpaquePointer?, _ role: Role, _ what: String, _ body: KeyPath<LuaCallSlot, [UInt8]?>
    ) -> Int32 {
        guard let slot = slot(L, LuaState.of(L), 1, role) else { return outsideCall(L, what) }
        pushBody(L, slot[keyPath: body])
        return 1
    }

    /// `req:set_body(s)` and `res:set_body(s)`, bounded by `limits.body` (`readBody`).
    private static func setBody(
        _ L: OpaquePointer?, _ role: Role, _ what: String, _ body: ReferenceWritableKeyPath<LuaCallSlot, [UInt8]?>
    ) -> Int32 {
        guard let slot = slot(L, LuaState.of(L), 1, role) else { return outsideCall(L, what) }
        switch readBody(L, 2, slot, "set_body") {
        case .failure(let failed): return failed.code
        case .success(let bytes): slot[keyPath: body] = bytes
        }
        return 0
    }

    private static func pushBody(_ L: OpaquePointer?, _ body: [UInt8]?) {
        if let body { Lua.push(L, bytes: body) } else { lua_pushnil(L) }
    }

    private struct Failed: Error {
        var code: Int32
    }

    /// The string at `index` as a body, refused past `limits.body`.
    private static func readBody(
        _ L: OpaquePointer?, _ index: Int32, _ slot: LuaCallSlot, _ function: StaticString
    ) -> Result<[UInt8], Failed> {
        guard let bytes = Lua.text(L, index) else { return .failure(Failed(code: Lua.badArgument(L, index, function, "string"))) }
        guard bytes.count <= slot.limits.body else {
            slot.bodyRefused = true
            return .failure(Failed(code: Lua.fail(L, "body of \(bytes.count) bytes is over limits.body (\(slot.limits.body))")))
        }
        return .success(Array(bytes))
    }

    // MARK: headers

    /// Runs `body` on the headers of the `headers` userdata at index 1.
    private static func withHeaders(
        _ L: OpaquePointer?, _ body: (inout HTTPFields, LuaCallSlot) -> Int32
    ) -> Int32 {
        let state = LuaState.of(L)
        if let slot = slot(L, state, 1, .requestHeaders) {
            slot.request.materializeHeaders()
            return body(&slot.request.headers, slot)
        }
        if let slot = slot(L, state, 1, .responseHeaders) { return body(&slot.response.headers, slot) }
        return outsideCall(L, "headers")
    }

    /// The slot of the request `headers` userdata at index 1 while its fields are still the
    /// forwarded request's lines (`LuaHeaderLines`).
    private static func lineSlot(_ L: OpaquePointer?) -> LuaCallSlot? {
        guard let slot = slot(L, LuaState.of(L), 1, .requestHeaders), slot.request.hasLines else { return nil }
        return slot
    }

    /// `get` on lines no edit has touched the field of: the matching values, joined with ", "
    /// by Lua (a field repeated is rare).
    private static func lineGet(_ L: OpaquePointer?, _ slot: LuaCallSlot, _ key: UnsafeRawBufferPointer) -> Int32 {
        // Read where it is: binding the lines to a constant copied the existential, and so
        // did reading them through the slot's stored property (~190 instructions a call).
        let found = pushValues(L, of: &slot.request, named: key)
        if !found { lua_pushnil(L) }
        return 1
    }

    /// Pushes the values of the lines' field `key`, joined with ", "; false when there is none.
    private static func pushValues(
        _ L: OpaquePointer?, of request: inout LuaRequestView, named key: UnsafeRawBufferPointer
    ) -> Bool {
        var found = false
        request.lines?.forEachScriptValue(named: key) { value in
            if found { Lua.push(L, ", ") }
            _ = lua_pushlstring(L, value.baseAddress, value.count)
            if found { lua_concat(L, 3) }
            found = true
        }
        return found
    }

    /// The string at `index` as a header name's bytes (`LuaLineEdits`), or nil with an error
    /// pushed, as `headerName` words it.
    private static func lineName(_ L: OpaquePointer?, _ index: Int32) -> UnsafeRawBufferPointer? {
        guard let bytes = Lua.bytes(L, index) else {
            _ = Lua.fail(L, "a header name must be a string, not \(Lua.typeName(L, index))")
            return nil
        }
        guard LuaLineEdits.isName(bytes) else {
            _ = Lua.fail(L, "invalid header name '\(Lua.printable(bytes))'")
            return nil
        }
        return bytes
    }

    /// `set` (`operation` `.set`) or `add` of the value at index 3 on lines: recorded as bytes
    /// when the value is plain (nearly always); else checked as a field (refused, or legalized
    /// as `HTTPField` does) and recorded as the field keeps it when ASCII, or made on the
    /// fields when not (the lines are built as fields first).
    private static func editLines(
        _ L: OpaquePointer?, _ slot: LuaCallSlot, _ operation: LuaLineEdits.Operation, _ name: UnsafeRawBufferPointer
    ) -> Int32 {
        if let value = Lua.text(L, 3), LuaLineEdits.isPlainValue(value) {
            Lua.holdForCall(L, heldPerField + name.count + value.count)
            slot.request.lineEdits.append(operation, name: name, value: value)
            return 0
        }
        guard let fieldName = headerName(L, 2), let field = headerField(L, fieldName, 3) else { return Lua.failure }
        Lua.holdForCall(L, editSize(L))
        if asciiValue(L, 3, field) != nil {
            var value = field.value
            value.withUTF8 { slot.request.lineEdits.append(operation, name: name, value: UnsafeRawBufferPointer($0)) }
            return 0
        }
        slot.request.materializeHeaders()
        if operation == .set {
            slot.request.headers[fields: fieldName] = [field]
        } else {
            slot.request.headers.append(field)
        }
        return 0
    }

    /// `remove` of the name at index 2 on lines.
    private static func removeFromLines(_ L: OpaquePointer?, _ slot: LuaCallSlot) -> Int32 {
        guard let name = lineName(L, 2) else { return Lua.failure }
        Lua.holdForCall(L, heldPerField + name.count)
        slot.request.lineEdits.append(.remove, name: name, value: UnsafeRawBufferPointer(start: nil, count: 0))
        return 0
    }

    /// Whether `name` is `key`, ASCII case-insensitively.
    @inline(__always)
    private static func matches(_ name: HTTPField.Name, _ key: UnsafeRawBufferPointer) -> Bool {
        let canonical = name.canonicalName.utf8
        guard canonical.count == key.count else { return false }
        let same = canonical.withContiguousStorageIfAvailable { bytes in
            for i in 0..<bytes.count {
                var k = key[i]
                if k >= UInt8(ascii: "A") && k <= UInt8(ascii: "Z") { k |= 0x20 }
                if bytes[i] != k { return false }
            }
            return true
        }
        if let same { return same }
        return canonical.elementsEqual(key.lazy.map { $0 >= UInt8(ascii: "A") && $0 <= UInt8(ascii: "Z") ? $0 | 0x20 : $0 })
    }

    private static let headerGet: Lua.Function = { L in
        guard let key = Lua.bytes(L, 2) else { return Lua.badArgument(L, 2, "get", "string") }
        if let slot = lineSlot(L), !slot.request.lineEdits.touch(key) { return lineGet(L, slot, key) }
        return withHeaders(L) { fields, _ in
            var found: Int?
            var joined: [UInt8]?
            for i in fields.indices where matches(fields[i].name, key) {
                if let first = found {
                    if joined == nil { joined = Array(fields[first].value.utf8) }
                    joined! += [UInt8(ascii: ","), UInt8(ascii: " ")]
                    joined! += fields[i].value.utf8
                } else {
                    found = i
                }
            }
            if let joined {
                Lua.push(L, bytes: joined)
            } else if let found {
                fields[found].withUnsafeBytesOfValue { _ = lua_pushlstring(L, $0.baseAddress, $0.count) }
            } else {
                lua_pushnil(L)
            }
            return 1
        }
    }

    private static let headerGetAll: Lua.Function = { L in
        guard let key = Lua.bytes(L, 2) else { return Lua.badArgument(L, 2, "get_all", "string") }
        return withHeaders(L) { fields, _ in
            lua_createtable(L, 0, 0)
            var n: lua_Integer = 0
            for field in fields where matches(field.name, key) {
                n += 1
                field.withUnsafeBytesOfValue { _ = lua_pushlstring(L, $0.baseAddress, $0.count) }
                lua_rawseti(L, -2, n)
            }
            return 1
        }
    }

    /// Whether the name at index 2 is `Host` and `self` the request's headers: the request's
    /// fields do not hold it — the encoder writes it from the URL's authority, which a script
    /// does not change — so `set`, `add` and `remove` of it would be ignored; they fail instead.
    private static func refusesHost(_ L: OpaquePointer?) -> Bool {
        guard let name = Lua.bytes(L, 2), name.count == 4, name[0] | 0x20 == 0x68, name[1] | 0x20 == 0x6F,
            name[2] | 0x20 == 0x73, name[3] | 0x20 == 0x74
        else { return false }
        return slot(L, LuaState.of(L), 1, .requestHeaders) != nil
    }

    private static func hostRefused(_ L: OpaquePointer?) -> Int32 {
        Lua.fail(L, "req.headers: Host follows the request's URL; a script cannot set, add or remove it")
    }

    private static let headerSet: Lua.Function = { L in
        if refusesHost(L) { return hostRefused(L) }
        if let slot = lineSlot(L) {
            if lua_type(L, 3) <= LUA_TNIL { return removeFromLines(L, slot) }
            guard let name = lineName(L, 2) else { return Lua.failure }
            return editLines(L, slot, .set, name)
        }
        guard let name = headerName(L, 2) else { return Lua.failure }
        if lua_type(L, 3) <= LUA_TNIL {
            return withHeaders(L) { fields, _ in
                fields[fields: name] = []
                return 0
            }
        }
        guard let field = headerField(L, name, 3) else { return Lua.failure }
        Lua.holdForCall(L, editSize(L))
        return withHeaders(L) { fields, _ in
            fields[fields: name] = [field]
            return 0
        }
    }

    private static let headerAdd: Lua.Function = { L in
        if refusesHost(L) { return hostRefused(L) }
        if let slot = lineSlot(L) {
            guard let name = lineName(L, 2) else { return Lua.failure }
            return editLines(L, slot, .add, name)
        }
        guard let name = headerName(L, 2) else { return Lua.failure }
        guard let field = headerField(L, name, 3) else { return Lua.failure }
        Lua.holdForCall(L, editSize(L))
        return withHeaders(L) { fields, _ in
            fields.append(field)
            return 0
        }
    }

    /// What a header field or edit record Swift keeps for a call costs beyond its name and
    /// value bytes, counted against the memory cap (`Lua.holdForCall`, `Lua.fitsCall`).
    static let heldPerField = 32

    /// What a `set` or `add` may keep until the call ends (an edit record, a field): its name
    /// and value and a record's worth more, counted against the memory cap (`Lua.holdForCall`)
    /// so that a loop of edits is bounded by it. The lines' edits count theirs in place.
    private static func editSize(_ L: OpaquePointer?) -> Int {
        heldPerField + Int(lua_rawlen(L, 2)) + Int(lua_rawlen(L, 3))
    }

    private static let headerRemove: Lua.Function = { L in
        if refusesHost(L) { return hostRefused(L) }
        if let slot = lineSlot(L) { return removeFromLines(L, slot) }
        guard let name = headerName(L, 2) else { return Lua.failure }
        return withHeaders(L) { fields, _ in
            fields[fields: name] = []
            return 0
        }
    }

    /// `each()`: an iterator closure over (the headers userdata, the next position).
    private static let headerEach: Lua.Function = { L in
        let state = LuaState.of(L)
        guard slot(L, state, 1, .requestHeaders) != nil || slot(L, state, 1, .responseHeaders) != nil else {
            return outsideCall(L, "headers")
        }
        lua_pushvalue(L, 1)
        lua_pushinteger(L, 0)
        Lua.push(L, function: headerStep, upvalues: 2)
        return 1
    }

    private static let headerStep: Lua.Function = { L in
        lua_settop(L, 0)
        lua_pushvalue(L, Lua.upvalue(2))
        let position = Lua.integer(L, Lua.upvalue(3)) ?? 0
        return withHeaders(L) { fields, _ in
            guard position < fields.count else { return 0 }
            let field = fields[position]
            Lua.push(L, field.name.rawName)
            field.withUnsafeBytesOfValue { _ = lua_pushlstring(L, $0.baseAddress, $0.count) }
            lua_pushinteger(L, lua_Integer(position + 1))
            sluice_lua_replace(L, Lua.upvalue(3))
            return 2
        }
    }

    private static let headersNewIndex: Lua.Function = { L in
        Lua.fail(L, "headers are changed with set, add and remove")
    }

    /// The header name at `index`, or nil with an error pushed. Names are looked up in the
    /// state's small cache first: a script names the same few headers on every call.
    private static func headerName(_ L: OpaquePointer?, _ index: Int32) -> HTTPField.Name? {
        guard let bytes = Lua.bytes(L, index) else {
            _ = Lua.fail(L, "a header name must be a string, not \(Lua.typeName(L, index))")
            return nil
        }
        let state = LuaState.of(L)
        if let name = state.headerNames.name(for: bytes) { return name }
        guard let name = HTTPField.Name(Lua.makeString(bytes)) else {
            _ = Lua.fail(L, "invalid header name '\(Lua.printable(bytes))'")
            return nil
        }
        state.headerNames.insert(bytes, name)
        return name
    }

    /// A field of `name` with the value at `index`, or nil with an error pushed (a value holding
    /// CR, LF or NUL would split the header block or end it early).
    private static func headerField(_ L: OpaquePointer?, _ name: HTTPField.Name, _ index: Int32) -> HTTPField? {
        guard let value = Lua.text(L, index) else {
            _ = Lua.fail(L, "header '\(name.rawName)' value must be a string, not \(Lua.typeName(L, index))")
            return nil
        }
        guard !value.contains(where: { $0 == 0x0D || $0 == 0x0A || $0 == 0 }) else {
            _ = Lua.fail(L, "header '\(name.rawName)' value contains CR, LF or NUL")
            return nil
        }
        // ASCII (nearly every value) through the String initializer, whose UTF-8 path is
        // specialized; other bytes through the byte initializer, which keeps obs-text as is.
        if value.allSatisfy({ $0 < 0x80 }) { return HTTPField(name: name, value: Lua.makeString(value)) }
        return HTTPField(name: name, value: value)
    }

    /// The value of `field`, made of the value at `index`, when that is ASCII (nearly every
    /// value; `HTTPField` keeps it so): an edit of lines carries it as a string. Nil for one
    /// with other bytes, kept as bytes in the fields.
    private static func asciiValue(_ L: OpaquePointer?, _ index: Int32, _ field: HTTPField) -> String? {
        guard let bytes = Lua.text(L, index), !bytes.contains(where: { $0 >= 0x80 }) else { return nil }
        return field.value
    }

    /// A field that frames the message or names the connection (RFC 9110 §7.6.1), which a
    /// script's answer may not set: Sluice writes `Content-Length` itself.
    private static func isFramingField(_ name: HTTPField.Name) -> Bool {
        switch name.canonicalName {
        case "content-length", "transfer-encoding", "connection", "keep-alive", "proxy-connection", "te", "trailer",
            "upgrade":
            true
        default: false
        }
    }

    // RFC 9110 tchar.
    private static func isTokenByte(_ b: UInt8) -> Bool {
        switch b {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            true
        default: Array("!#$%&'*+-.^_`|~".utf8).contains(b)
        }
    }

    /// A byte that may stand in a request target as the request parser takes one from a
    /// client: visible ASCII, not `#` (the rest is percent-encoded: raw, it would reach the
    /// origin as one engine or the other spells it, or as U+FFFD).
    private static func isTargetByte(_ b: UInt8) -> Bool {
        b > 0x20 && b < 0x7F && b != UInt8(ascii: "#")
    }
}

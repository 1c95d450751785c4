import CLua

/// `sluice.json.encode(v)` and `sluice.json.decode(s)`, straight between JSON bytes and the Lua
/// stack (no Swift value tree in between).
///
/// Encoding: a table whose keys are exactly 1…n is an array, any other table an object with
/// its keys sorted (the same table always encodes to the same bytes: a signer can hash it);
/// an empty table is `{}`; `sluice.json.null` (and nil in an array) is `null`. Functions,
/// userdata, NaN and infinities, non-string keys other than numbers, and nesting deeper than
/// `maxDepth` (a cycle) are errors.
///
/// Decoding: objects and arrays become tables, `null` becomes `sluice.json.null`, integers
/// that fit 64 bits become Lua integers. Bad input returns nil and a reason with the byte
/// offset. A decode that grows the heap past `limits.memory` stops the call as the memory
/// limit would.
///
/// Threading: the state's thread (see `Lua` for the error discipline).
enum LuaJSON {
    static let maxDepth = 64

    static let encode: Lua.Function = { L in
        var out: [UInt8] = []
        if let problem = encodeValue(L, 1, depth: 0, held: 0, into: &out) {
            if problem == memoryProblem { return Lua.failMemory(L) }
            return Lua.fail(L, "json.encode: \(problem)")
        }
        Lua.push(L, bytes: out)
        return 1
    }

    static let decode: Lua.Function = { L in
        guard let text = Lua.bytes(L, 1) else { return Lua.badArgument(L, 1, "decode", "string") }
        var parser = Parser(L: L, text: text, meter: sluice_lua_meter_of(L))
        parser.skipSpace()
        var failure = parser.value(depth: 0)
        if failure == nil {
            parser.skipSpace()
            if parser.position < text.count { failure = parser.problem("trailing characters") }
        }
        guard let failure else { return 1 }
        if failure == Parser.memory { return Lua.fail(L, "memory limit reached") }
        lua_pushnil(L)
        Lua.push(L, "json.decode: " + failure)
        return 2
    }

    // MARK: Encoding

    /// `encodeValue`'s answer when the text would pass the call's memory cap: a table may
    /// name one long string, or one inner table, many times, and its text is not Lua's memory.
    private static let memoryProblem = "memory limit reached"

    /// `held`: the bytes of the keys the tables above this value keep while it is encoded.
    private static func encodeValue(
        _ L: OpaquePointer?, _ index: Int32, depth: Int, held: Int, into out: inout [UInt8]
    ) -> String? {
        guard Lua.fitsCall(L, out.count + held) else { return memoryProblem }
        let index = lua_absindex(L, index)
        switch lua_type(L, index) {
        case LUA_TNIL, LUA_TNONE: out += Array("null".utf8)
        case LUA_TLIGHTUSERDATA where lua_touserdata(L, index) == nil: out += Array("null".utf8)
        case LUA_TBOOLEAN: out += Array((lua_toboolean(L, index) != 0 ? "true" : "false").utf8)
        case LUA_TNUMBER:
            if sluice_lua_isinteger(L, index) != 0 {
                out += Array(String(Lua.integer(L, index) ?? 0).utf8)
            } else {
                var isNumber: Int32 = 0
                let d = sluice_lua_tonumber(L, index, &isNumber)
                guard d.isFinite else { return "cannot encode \(d)" }
                out += Array("\(d)".utf8)
            }
        case LUA_TSTRING: appendString(Lua.bytes(L, index)!, to: &out)
        case LUA_TTABLE:
            guard depth < maxDepth else { return "nesting deeper than \(maxDepth) (a cycle?)" }
            guard lua_checkstack(L, 4) != 0 else { return "nesting too deep" }
            return encodeTable(L, index, depth: depth, held: held, into: &out)
        default: return "cannot encode a \(Lua.typeName(L, index))"
        }
        return nil
    }

    /// Its keys are copied (sorted, they give the order) and kept while its values are
    /// encoded: counted with `held` against the call's memory cap, as a table that names one
    /// long key at every level of a cycle would otherwise copy it 64 times.
    private static func encodeTable(
        _ L: OpaquePointer?, _ index: Int32, depth: Int, held: Int, into out: inout [UInt8]
    ) -> String? {
        let length = Int(lua_rawlen(L, index))
        var keys: [(text: [UInt8], isString: Bool)] = []
        var count = 0
        var held = held
        lua_pushnil(L)
        while lua_next(L, index) != 0 {
            count += 1
            switch lua_type(L, -2) {
            case LUA_TSTRING:
                held += 16 + Int(lua_rawlen(L, -2))
                guard Lua.fitsCall(L, out.count + held) else {
                    sluice_lua_pop(L, 2)
                    return memoryProblem
                }
                keys.append((Array(Lua.bytes(L, -2)!), true))
            case LUA_TNUMBER:
                lua_pushvalue(L, -2)
                keys.append((Array(Lua.text(L, -1)!), false))
                sluice_lua_pop(L, 1)
                held += 16 + keys[keys.count - 1].text.count
            default:
                let type = Lua.typeName(L, -2)
                sluice_lua_pop(L, 2)
                return "cannot encode a \(type) key"
            }
            sluice_lua_pop(L, 1)
        }
        if length > 0 && count == length {
            out.append(UInt8(ascii: "["))
            for i in 1...length {
                if i > 1 { out.append(UInt8(ascii: ",")) }
                lua_rawgeti(L, index, lua_Integer(i))
                let problem = encodeValue(L, -1, depth: depth + 1, held: held, into: &out)
                sluice_lua_pop(L, 1)
                if let problem { return problem }
            }
            out.append(UInt8(ascii: "]"))
            return nil
        }
        keys.sort { $0.text.lexicographicallyPrecedes($1.text) }
        out.append(UInt8(ascii: "{"))
        for (n, key) in keys.enumerated() {
            if n > 0 { out.append(UInt8(ascii: ",")) }
            key.text.withUnsafeBytes { appendString($0, to: &out) }
            out.append(UInt8(ascii: ":"))
            _ = key.text.withUnsafeBytes { lua_pushlstring(L, $0.baseAddress, $0.count) }
            if !key.isString {
                // A number key: look it up as the number it was.
                var isNumber: Int32 = 0
                let number = sluice_lua_tonumber(L, -1, &isNumber)
                sluice_lua_pop(L, 1)
                if let integer = Int64(exactly: number) { lua_pushinteger(L, integer) } else { lua_pushnumber(L, number) }
            }
            lua_rawget(L, index)
            let problem = encodeValue(L, -1, depth: depth + 1, held: held, into: &out)
            sluice_lua_pop(L, 1)
            if let problem { return problem }
        }
        out.append(UInt8(ascii: "}"))
        return nil
    }

    private static func appendString(_ bytes: UnsafeRawBufferPointer, to out: inout [UInt8]) {
        let digits = Array("0123456789abcdef".utf8)
        out.append(UInt8(ascii: "\""))
        for b in bytes {
            switch b {
            case UInt8(ascii: "\""): out += [UInt8(ascii: "\\"), UInt8(ascii: "\"")]
            case UInt8(ascii: "\\"): out += [UInt8(ascii: "\\"), UInt8(ascii: "\\")]
            case 0x0A: out += [UInt8(ascii: "\\"), UInt8(ascii: "n")]
            case 0x0D: out += [UInt8(ascii: "\\"), UInt8(ascii: "r")]
            case 0x09: out += [UInt8(ascii: "\\"), UInt8(ascii: "t")]
            case 0..<0x20, 0x7F:
                out += Array("\\u00".utf8)
                out += [digits[Int(b >> 4)], digits[Int(b & 15)]]
            default: out.append(b)
            }
        }
        out.append(UInt8(ascii: "\""))
    }

    // MARK: Decoding

    /// A recursive-descent parser pushing each value it reads onto the stack; each method
    /// returns nil on success (one value pushed) or a problem (nothing left pushed).
    private struct Parser {
        static let memory = "memory"
        let L: OpaquePointer?
        let text: UnsafeRawBufferPointer
        let meter: UnsafeMutablePointer<sluice_lua_meter>
        var position = 0

        func problem(_ what: String) -> String { "\(what) at byte \(position + 1)" }

        mutating func skipSpace() {
            while position < text.count, [0x20, 0x09, 0x0A, 0x0D].contains(text[position]) { position += 1 }
        }

        mutating func value(depth: Int) -> String? {
            guard meter.pointee.used <= meter.pointee.limit else {
                meter.pointee.stopped = Int32(SLUICE_LUA_STOPPED_MEMORY)
                return Self.memory
            }
            guard position < text.count else { return problem("unexpected end") }
            switch text[position] {
            case UInt8(ascii: "{"):
                guard depth < maxDepth, lua_checkstack(L, 4) != 0 else { return problem("nesting too deep") }
                return object(depth: depth)
            case UInt8(ascii: "["):
                guard depth < maxDepth, lua_checkstack(L, 4) != 0 else { return problem("nesting too deep") }
                return array(depth: depth)
            case UInt8(ascii: "\""): return string()
            case UInt8(ascii: "t"):
                guard skip("true") else { return problem("unexpected character") }
                lua_pushboolean(L, 1)
            case UInt8(ascii: "f"):
                guard skip("false") else { return problem("unexpected character") }
                lua_pushboolean(L, 0)
            case UInt8(ascii: "n"):
                guard skip("null") else { return problem("unexpected character") }
                lua_pushlightuserdata(L, nil)
            default: return number()
            }
            return nil
        }

        /// Skips `word` if it comes next.
        mutating func skip(_ word: StaticString) -> Bool {
            let n = word.utf8CodeUnitCount
            guard position + n <= text.count,
                Lua.equals(UnsafeRawBufferPointer(rebasing: text[position..<position + n]), word)
            else { return false }
            position += n
            return true
        }

        mutating func object(depth: Int) -> String? {
            position += 1
            lua_createtable(L, 0, 0)
            skipSpace()
            if position < text.count && text[position] == UInt8(ascii: "}") {
                position += 1
                return nil
            }
            while true {
                skipSpace()
                guard position < text.count, text[position] == UInt8(ascii: "\"") else { return fail(problem("expected a key")) }
                if let problem = string() { return fail(problem) }
                skipSpace()
                guard position < text.count, text[position] == UInt8(ascii: ":") else {
                    return fail(problem("expected ':'"), pending: 1)
                }
                position += 1
                skipSpace()
                if let problem = value(depth: depth + 1) { return fail(problem, pending: 1) }
                lua_rawset(L, -3)
                skipSpace()
                guard position < text.count else { return fail(problem("unexpected end")) }
                position += 1
                if text[position - 1] == UInt8(ascii: "}") { return nil }
                guard text[position - 1] == UInt8(ascii: ",") else {
                    position -= 1
                    return fail(problem("expected ',' or '}'"))
                }
            }
        }

        mutating func array(depth: Int) -> String? {
            position += 1
            lua_createtable(L, 0, 0)
            skipSpace()
            if position < text.count && text[position] == UInt8(ascii: "]") {
                position += 1
                return nil
            }
            var n: lua_Integer = 0
            while true {
                skipSpace()
                if let problem = value(depth: depth + 1) { return fail(problem) }
                n += 1
                lua_rawseti(L, -2, n)
                skipSpace()
                guard position < text.count else { return fail(problem("unexpected end")) }
                position += 1
                if text[position - 1] == UInt8(ascii: "]") { return nil }
                guard text[position - 1] == UInt8(ascii: ",") else {
                    position -= 1
                    return fail(problem("expected ',' or ']'"))
                }
            }
        }

        /// Pops the container being built (and `pending` keys above it) and passes `problem` on.
        func fail(_ problem: String, pending: Int32 = 0) -> String {
            sluice_lua_pop(L, 1 + pending)
            return problem
        }

        mutating func string() -> String? {
            position += 1
            switch JSONStringLiteral.decode(text, from: &position) {
            case .success(let out):
                Lua.push(L, bytes: out)
                return nil
            case .failure(let why): return problem(why.rawValue)
            }
        }

        mutating func number() -> String? {
            let start = position
            var isInteger = true
            if position < text.count && text[position] == UInt8(ascii: "-") { position += 1 }
            let digitsStart = position
            while position < text.count {
                let c = text[position]
                if c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9") {
                    position += 1
                } else if c == UInt8(ascii: ".") || c == UInt8(ascii: "e") || c == UInt8(ascii: "E") || c == UInt8(ascii: "+")
                    || c == UInt8(ascii: "-")
                {
                    isInteger = false
                    position += 1
                } else {
                    break
                }
            }
            guard position > digitsStart else {
                position = start
                return problem("unexpected character")
            }
            let literal = Lua.makeString(UnsafeRawBufferPointer(rebasing: text[start..<position]))
            if isInteger, let integer = Int64(literal) {
                lua_pushinteger(L, integer)
            } else if let double = Double(literal), double.isFinite {
                lua_pushnumber(L, double)
            } else {
                position = start
                return problem("bad number")
            }
            return nil
        }
    }
}

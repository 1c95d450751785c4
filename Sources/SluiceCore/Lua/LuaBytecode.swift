import CLua

/// A compiled chunk read back from `lua_dump` (Lua 5.4's binary format, `ldump.c` of 5.4.4) far
/// enough to find where its functions write globals: the load-time half of "globals are frozen
/// after the script loads" (`LuaState` refuses a script whose hooks write a global before it
/// runs a line of it; the frozen environment's `__newindex` is the run-time half).
///
/// A global write is an `OP_SETTABUP` whose table is the chunk's own `_ENV`: upvalue 0 of the
/// main function, or an upvalue of a nested function that captures it, level by level (an
/// upvalue of the parent's upvalue, never of a local). So `local _ENV = {}` in a function, and
/// a local named like a global, are not globals; `_ENV.x = 1` and `x = 1` are, at any depth of
/// nesting. What this reading does not see is refused when it runs: a write through an alias
/// (`local e = _ENV; e.x = 1`, `_ENV[k] = v`, `_G.x = 1`), in a chunk a hook `load`s, or in a
/// function with more than 255 constants (whose globals Lua reaches through a register).
///
/// Threading: a value; any thread.
struct LuaBytecode {
    /// One function prototype of the chunk.
    struct Function {
        var lineDefined = 0
        var code: [UInt32] = []
        /// The string constants by index (nil for the others).
        var strings: [String?] = []
        /// Each upvalue: whether it captures a local of the enclosing function (`instack`), and
        /// the index of that local or of the enclosing function's upvalue.
        var upvalues: [(inStack: Bool, index: Int)] = []
        var children: [Function] = []
        var lineInfo: [Int8] = []
        var absoluteLineInfo: [(pc: Int, line: Int)] = []

        /// String constant `index`; nil when out of range or not a string.
        func string(_ index: Int) -> String? {
            index < strings.count ? strings[index] : nil
        }

        /// The source line of instruction `pc` (`luaG_getfuncline`).
        func line(at pc: Int) -> Int {
            var base = -1
            var line = lineDefined
            if let entry = absoluteLineInfo.last(where: { $0.pc <= pc }) {
                base = entry.pc
                line = entry.line
            }
            while base < pc, base + 1 < lineInfo.count {
                base += 1
                line += Int(lineInfo[base])
            }
            return line
        }
    }

    /// A name where the source uses it: a global written, a metric's name.
    struct Site: Equatable {
        var name: String
        var line: Int
    }

    let main: Function

    /// Reads a `lua_dump` of a Lua 5.4 function; nil when the bytes are not that format.
    init?(_ bytes: [UInt8]) {
        var reader = Reader(bytes: bytes)
        guard let main = reader.chunk() else { return nil }
        self.main = main
    }

    /// The global writes of every function but the main one (whose top level may set globals),
    /// in source order.
    var hookGlobalWrites: [Site] {
        var found: [Site] = []
        for child in main.children { Self.collect(child, parentGlobals: [0], into: &found) }
        return found.sorted { ($0.line, $0.name) < ($1.line, $1.name) }
    }

    /// The literal names of `sluice.metric("name")` calls, in every function (checked at load,
    /// `LuaMetricAPI`): `GETTABUP "sluice"`, `GETFIELD "metric"` on its result, `LOADK` of
    /// the name into the call's first argument, and the call itself. A name passed any other
    /// way (`"by_" .. method`, a variable) is checked when the call runs.
    var metricNames: [Site] {
        var found: [Site] = []
        var pending = [main]
        while let function = pending.popLast() {
            pending += function.children
            let code = function.code
            for pc in code.indices.dropFirst().dropLast(2) where code[pc] & 0x7F == Self.getField {
                let previous = code[pc - 1]
                let next = code[pc + 1]
                let call = code[pc + 2]
                let register = (code[pc] >> 7) & 0xFF
                guard previous & 0x7F == Self.getTableUpvalue, (previous >> 7) & 0xFF == (code[pc] >> 16) & 0xFF,
                    function.string(Int(previous >> 24)) == "sluice", function.string(Int(code[pc] >> 24)) == "metric",
                    next & 0x7F == Self.loadConstant, (next >> 7) & 0xFF == register + 1,
                    call & 0x7F == Self.call || call & 0x7F == Self.tailCall, (call >> 7) & 0xFF == register,
                    let name = function.string(Int(next >> 15))
                else { continue }
                found.append(Site(name: name, line: function.line(at: pc + 1)))
            }
        }
        return found.sorted { ($0.line, $0.name) < ($1.line, $1.name) }
    }

    /// Whether the main function may touch register `register` (a parameter: 0 is the first):
    /// an instruction names it (read or written, alone or inside a range that starts at `A`),
    /// or a closure of it captures it. Erring towards yes (a field of an opcode that may be a
    /// register or a constant is taken as a register), never towards no. The hooks use it to
    /// skip making `ctx` for a hook that declares it but never touches it.
    func mayUse(register: Int) -> Bool {
        let r = UInt32(register)
        for instruction in main.code {
            let op = instruction & 0x7F
            let a = (instruction >> 7) & 0xFF
            let k = (instruction >> 15) & 1 != 0
            let b = (instruction >> 16) & 0xFF
            let c = (instruction >> 24) & 0xFF
            if Self.opcodesWithRangeA.contains(op) ? a <= r : (!Self.opcodesWithoutRegisterA.contains(op) && a == r) {
                return true
            }
            if Self.opcodesWithRegisterB.contains(op), b == r { return true }
            if Self.opcodesWithRegisterC.contains(op), c == r { return true }
            if Self.opcodesWithRegisterOrConstantC.contains(op), !k, c == r { return true }
        }
        return main.children.contains { child in child.upvalues.contains { $0.inStack && $0.index == register } }
    }

    /// `A` the first of a range of registers: `LOADNIL`, `CONCAT`, the numeric and generic
    /// `for`, `CALL`, `TAILCALL`, `RETURN`, `SETLIST`, `VARARG`.
    private static let opcodesWithRangeA: Set<UInt32> = [8, 53, 68, 69, 70, 73, 74, 75, 76, 77, 78, 80]
    /// `SETTABUP` (`A` an upvalue), `JMP`, `RETURN0`, `EXTRAARG`: no register in `A`.
    private static let opcodesWithoutRegisterA: Set<UInt32> = [15, 56, 71, 82]
    /// `B` a register: `MOVE`, `GETTABLE`, `GETI`, `GETFIELD`, `SETTABLE`, `SELF`, the arithmetic
    /// with an immediate or a constant (`ADDI` … `SHLI`), with registers (`ADD` … `SHR`),
    /// `MMBIN`, `UNM`, `BNOT`, `NOT`, `LEN`, `EQ`, `LT`, `LE`, `TESTSET`.
    private static let opcodesWithRegisterB: Set<UInt32> = Set(
        [0, 12, 13, 14, 16, 20] + Array(21...46) + [49, 50, 51, 52, 57, 58, 59, 67])
    /// `C` a register: `GETTABLE`, `ADD` … `SHR`.
    private static let opcodesWithRegisterC: Set<UInt32> = Set([12] + Array(34...45))
    /// `C` a register unless `k` marks a constant: `SETTABUP`, `SETTABLE`, `SETI`, `SETFIELD`, `SELF`.
    private static let opcodesWithRegisterOrConstantC: Set<UInt32> = [15, 16, 17, 18, 20]

    // Opcodes (lopcodes.h of 5.4.4).
    /// `OP_LOADK`, `R[A] := K[Bx]`.
    private static let loadConstant: UInt32 = 3
    /// `OP_GETTABUP`, `R[A] := UpValue[B][K[C]:shortstring]`.
    private static let getTableUpvalue: UInt32 = 11
    /// `OP_GETFIELD`, `R[A] := R[B][K[C]:shortstring]`.
    private static let getField: UInt32 = 14
    /// `OP_SETTABUP`, `UpValue[A][K[B]:shortstring] := RK(C)`.
    private static let setTableUpvalue: UInt32 = 15
    /// `OP_CALL`, `R[A], … := R[A](R[A+1], …)`.
    private static let call: UInt32 = 68
    /// `OP_TAILCALL`, `return R[A](R[A+1], …)`.
    private static let tailCall: UInt32 = 69

    private static func collect(_ function: Function, parentGlobals: Set<Int>, into found: inout [Site]) {
        var globals = Set<Int>()
        for (i, upvalue) in function.upvalues.enumerated() where !upvalue.inStack && parentGlobals.contains(upvalue.index) {
            globals.insert(i)
        }
        if !globals.isEmpty {
            for (pc, instruction) in function.code.enumerated() where instruction & 0x7F == setTableUpvalue {
                let upvalue = Int((instruction >> 7) & 0xFF)
                let key = Int((instruction >> 16) & 0xFF)
                guard globals.contains(upvalue) else { continue }
                let name = function.string(key) ?? "?"
                found.append(Site(name: name, line: function.line(at: pc)))
            }
        }
        for child in function.children { collect(child, parentGlobals: globals, into: &found) }
    }

    /// The function on top of `L`'s stack as `lua_dump` writes it, debug information kept.
    static func dump(_ L: OpaquePointer) -> [UInt8] {
        var bytes: [UInt8] = []
        _ = withUnsafeMutablePointer(to: &bytes) { out in
            lua_dump(
                L,
                { _, chunk, size, out in
                    guard let chunk, let out else { return 1 }
                    out.assumingMemoryBound(to: [UInt8].self).pointee.append(
                        contentsOf: UnsafeRawBufferPointer(start: chunk, count: size))
                    return 0
                }, out, 0)
        }
        return bytes
    }

    /// A cursor over the dump; every read fails (nil) past the end.
    private struct Reader {
        let bytes: [UInt8]
        var at = 0

        mutating func chunk() -> Function? {
            // "\x1bLua", version 5.4, format 0, LUAC_DATA, sizes of Instruction, lua_Integer
            // and lua_Number, LUAC_INT, LUAC_NUM, then the main function's upvalue count.
            let header: [UInt8] = [0x1B, 0x4C, 0x75, 0x61, 0x54, 0x00, 0x19, 0x93, 0x0D, 0x0A, 0x1A, 0x0A, 4, 8, 8]
            guard bytes.count > header.count + 17, Array(bytes[0..<header.count]) == header else { return nil }
            at = header.count + 16 + 1
            return function()
        }

        mutating func byte() -> UInt8? {
            guard at < bytes.count else { return nil }
            defer { at += 1 }
            return bytes[at]
        }

        /// `dumpSize`: 7 bits a byte, most significant first, the last byte marked by 0x80.
        mutating func size() -> Int? {
            var value = 0
            while let b = byte() {
                guard value < Int.max >> 7 else { return nil }
                value = value << 7 | Int(b & 0x7F)
                if b & 0x80 != 0 { return value }
            }
            return nil
        }

        mutating func skip(_ n: Int) -> Bool {
            guard n >= 0, at + n <= bytes.count else { return false }
            at += n
            return true
        }

        /// `dumpString`: a size of 0 is NULL, else size - 1 bytes.
        mutating func string() -> String?? {
            guard let n = size() else { return nil }
            if n == 0 { return .some(nil) }
            guard at + n - 1 <= bytes.count else { return nil }
            defer { at += n - 1 }
            return .some(String(decoding: bytes[at..<(at + n - 1)], as: UTF8.self))
        }

        mutating func function() -> Function? {
            var f = Function()
            guard string() != nil, let lineDefined = size(), size() != nil, skip(3) else { return nil }
            f.lineDefined = lineDefined
            guard let codeCount = size(), at + codeCount * 4 <= bytes.count else { return nil }
            f.code.reserveCapacity(codeCount)
            for _ in 0..<codeCount {
                f.code.append(
                    UInt32(bytes[at]) | UInt32(bytes[at + 1]) << 8 | UInt32(bytes[at + 2]) << 16 | UInt32(bytes[at + 3]) << 24)
                at += 4
            }
            guard let constantCount = size() else { return nil }
            for _ in 0..<constantCount {
                switch byte() {
                case 0x03, 0x13:  // LUA_VNUMINT, LUA_VNUMFLT
                    guard skip(8) else { return nil }
                    f.strings.append(nil)
                case 0x04, 0x14:  // LUA_VSHRSTR, LUA_VLNGSTR
                    guard let s = string() else { return nil }
                    f.strings.append(s)
                case 0x00, 0x01, 0x11:  // nil, false, true
                    f.strings.append(nil)
                default: return nil
                }
            }
            guard let upvalueCount = size() else { return nil }
            for _ in 0..<upvalueCount {
                guard let inStack = byte(), let index = byte(), byte() != nil else { return nil }
                f.upvalues.append((inStack != 0, Int(index)))
            }
            guard let childCount = size() else { return nil }
            for _ in 0..<childCount {
                guard let child = function() else { return nil }
                f.children.append(child)
            }
            guard let lineCount = size(), at + lineCount <= bytes.count else { return nil }
            f.lineInfo = bytes[at..<(at + lineCount)].map { Int8(bitPattern: $0) }
            at += lineCount
            guard let absoluteCount = size() else { return nil }
            for _ in 0..<absoluteCount {
                guard let pc = size(), let line = size() else { return nil }
                f.absoluteLineInfo.append((pc, line))
            }
            guard let localCount = size() else { return nil }
            for _ in 0..<localCount {
                guard string() != nil, size() != nil, size() != nil else { return nil }
            }
            guard let nameCount = size() else { return nil }
            for _ in 0..<nameCount {
                guard string() != nil else { return nil }
            }
            return f
        }
    }
}

import SluiceCore

/// `sluice.shared` over the fleet's Redis (docs/scripting.md, "Shared values"): one table for
/// every instance. Each key is `PREFIX{lua|KEY}`; its value is tagged with its type — `s` and
/// the text, `i` and an integer, `n` and a number — so a script reads back what it stored, as
/// from the process's table. `incr` is one script (`incr`), atomic in Redis; the TTL of a key
/// it makes is the counter's window. A Redis that cannot answer now (`isUsable`, a timeout)
/// answers `nil, "sluice.shared: …"`: the script decides.
///
/// Threading: the worker's thread, as every `Fleet` call.
extension Fleet: LuaSharedStore {
    func perform(
        _ operation: LuaSharedOperation,
        completion: @escaping (Result<LuaSharedMemory.Value?, LuaSharedMemory.Failure>) -> Void
    ) {
        guard client.isUsable else { return completion(.failure(.unavailable("the fleet's Redis is not available"))) }
        switch operation {
        case .get(let key):
            client.send(["GET", luaKey(key)]) { reply in
                switch reply {
                case .null: completion(.success(nil))
                case .string(let stored): completion(Self.decode(stored).map { .success($0) } ?? Self.unexpected(reply))
                default: completion(Self.unexpected(reply))
                }
            }
        case .set(let key, nil, _):
            client.send(["DEL", luaKey(key)]) { reply in
                if case .integer = reply { completion(.success(nil)) } else { completion(Self.unexpected(reply)) }
            }
        case .set(let key, let value?, let ttl):
            var command = ["SET", luaKey(key), Self.encode(value)]
            if let ttl { command += ["PX", String(max(1, ttl / 1000))] }
            client.send(command) { reply in
                if case .status = reply { completion(.success(nil)) } else { completion(Self.unexpected(reply)) }
            }
        case .incr(let key, let by, let ttl):
            let (amount, integer): (String, Bool) =
                switch by {
                case .integer(let i): (String(i), true)
                case .number(let d): ("\(d)", false)
                case .string: ("0", true)  // LuaShared passes numbers only
                }
            let window = ttl.map { String(max(1, $0 / 1000)) } ?? ""
            client.eval(FleetLuaScripts.incr, keys: [luaKey(key)], args: [amount, integer ? "i" : "n", window]) {
                reply in
                switch reply {
                case .string(let stored): completion(Self.decode(stored).map { .success($0) } ?? Self.unexpected(reply))
                case .error(let message) where message.contains("not a number"): completion(.failure(.notANumber))
                default: completion(Self.unexpected(reply))
                }
            }
        }
    }

    private func luaKey(_ key: String) -> String { settings.keyPrefix + "{lua|" + key + "}" }

    private static func encode(_ value: LuaSharedMemory.Value) -> String {
        switch value {
        case .string(let s): "s" + s
        case .integer(let i): "i" + String(i)
        case .number(let d): "n" + "\(d)"
        }
    }

    private static func decode(_ stored: String) -> LuaSharedMemory.Value? {
        let rest = String(stored.dropFirst())
        switch stored.first {
        case "s": return .string(rest)
        // An integer past Int's range (written by another version) reads as a number.
        case "i": return Int(rest).map { .integer($0) } ?? Double(rest).map { .number($0) }
        case "n": return Double(rest).map { .number($0) }
        default: return nil
        }
    }

    private static func unexpected(_ reply: RedisReply) -> Result<LuaSharedMemory.Value?, LuaSharedMemory.Failure> {
        switch reply {
        case .failed(let why), .error(let why): .failure(.unavailable(why))
        default: .failure(.unavailable("the fleet's Redis answered something unexpected"))
        }
    }
}

/// The Redis script behind `sluice.shared.incr` over the fleet (`FleetLuaShared`). KEYS[1]:
/// the key; ARGV[1]: the amount; ARGV[2]: `i` when it is an integer; ARGV[3]: the window in
/// ms for a key this call makes (empty: none). Answers the tagged sum, or an error for a key
/// holding a string. A key that exists keeps its TTL. Integer sums are exact up to 2^53 (Redis's
/// Lua has doubles only): past it the sum is kept and answered as a number.
enum FleetLuaScripts {
    static let incr = RedisScript(
        """
        local v = redis.call('GET', KEYS[1])
        local n, int = 0, ARGV[2] == 'i'
        if v then
          local t = string.sub(v, 1, 1)
          if t ~= 'i' and t ~= 'n' then return redis.error_reply('not a number') end
          n = tonumber(string.sub(v, 2))
          if t == 'n' then int = false end
        end
        n = n + tonumber(ARGV[1])
        -- Redis's Lua counts in doubles: exact integers end at 2^53, past which the sum is a number.
        if int and (n >= 9007199254740992 or n <= -9007199254740992) then int = false end
        local stored
        if int then stored = 'i' .. string.format('%.0f', n) else stored = 'n' .. string.format('%.17g', n) end
        if v then
          redis.call('SET', KEYS[1], stored, 'KEEPTTL')
        elseif ARGV[3] ~= '' then
          redis.call('SET', KEYS[1], stored, 'PX', ARGV[3])
        else
          redis.call('SET', KEYS[1], stored)
        end
        return stored
        """)
}

import CLua

/// One `lua.allow_hosts` entry: a host (any port) or `host:port`; an IPv6 address in
/// brackets. Hosts compare case-insensitively, exactly (no wildcards).
///
/// Threading: an immutable value.
public struct LuaAllowedHost: Sendable, Hashable, CustomStringConvertible {
    /// Lower case, without brackets.
    public let host: String
    /// nil: any port.
    public let port: Int?

    /// Reads `host`, `host:port`, `[v6]` or `[v6]:port`; nil (with the reason) for anything
    /// else: a scheme, a path, user info, an empty host, a port outside 1…65535.
    public static func parse(_ text: String) -> Result<LuaAllowedHost, LuaOperationError> {
        guard let (host, port) = split(authority: Substring(text)) else {
            return .failure(LuaOperationError("'\(text)' is not a host or host:port (no scheme, path or user)"))
        }
        return .success(LuaAllowedHost(host: host, port: port))
    }

    private init(host: String, port: Int?) {
        self.host = host
        self.port = port
    }

    func allows(host: String, port: Int) -> Bool {
        self.host == host && (self.port == nil || self.port == port)
    }

    public var description: String {
        let name = host.contains(":") ? "[\(host)]" : host
        return port.map { "\(name):\($0)" } ?? name
    }

    /// `host[:port]` split, the host lower-cased and unbracketed; nil when malformed.
    static func split(authority: Substring) -> (host: String, port: Int?)? {
        var rest = authority
        let host: Substring
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]") else { return nil }
            host = rest[rest.index(after: rest.startIndex)..<close]
            rest = rest[rest.index(after: close)...]
            guard host.allSatisfy({ $0.isHexDigit || $0 == ":" || $0 == "." }) else { return nil }
        } else {
            let colon = rest.firstIndex(of: ":") ?? rest.endIndex
            host = rest[..<colon]
            rest = rest[colon...]
            guard host.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "." || $0 == "_") })
            else { return nil }
        }
        guard !host.isEmpty else { return nil }
        var port: Int?
        if !rest.isEmpty {
            guard rest.first == ":", let n = Int(rest.dropFirst()), (1...65535).contains(n) else { return nil }
            port = n
        }
        return (host.lowercased(), port)
    }
}

/// A request a script sends with `sluice.http`.
public struct LuaSubrequest: Sendable {
    public var method: String
    /// Absolute, `http://` or `https://`.
    public var url: String
    public var headers: [(String, String)]
    public var body: [UInt8]?
    /// The time it may take: the script's `timeout`, never past the call's wall-clock budget.
    public var timeoutMicroseconds: Int64
    /// The depth it carries (`depthHeader`): its requester's plus one.
    public var depth: Int
    /// The largest response body read (`limits.body`); a larger one fails the call.
    public var maxBody: Int

    /// The header a sub-request carries its depth in, so that the scripts of the policy it
    /// goes through know how deep they are (`maxDepth`): `N TOKEN`, where `TOKEN` is this
    /// process's `depthToken` (`headerValue`). A client's request may carry the header too;
    /// its depth is read only when the token is this process's (`depth(fromHeader:)`), else it
    /// is 0, so no client can claim a depth that stops the scripts' sub-requests (and a script
    /// that audits with `sluice.http` cannot be skipped by a header). The header never goes
    /// upstream (`ForwardedHeaders.isDroppedRequestField`): a fleet peer asked for a sub-request's
    /// URL gets the depth alone (`PeerHop`), which it reads from a signed peer request only; an
    /// `https` sub-request carries it only when its CONNECT is intercepted (`WorkerLuaHost`).
    public static let depthHeader = "Sluice-Lua-Depth"
    /// `2`: a script may call `sluice.http` from a client's request and from a sub-request's,
    /// not deeper, so scripts that call each other cannot recurse without bound.
    public static let maxDepth = 2

    /// 32 hex digits from the system's random generator, chosen once per process: what makes
    /// a sub-request's `depthHeader` this process's own.
    public static let depthToken: String = {
        var generator = SystemRandomNumberGenerator()
        return Hex.lowercase((0..<16).map { _ in UInt8.random(in: .min ... .max, using: &generator) })
    }()

    /// The `depthHeader` value of a sub-request `depth` deep.
    public static func headerValue(depth: Int) -> String { "\(depth) \(depthToken)" }

    /// The depth a `depthHeader` value says: its number when it carries this process's token
    /// (or any, with `anyToken`: a fleet peer's signed request), else 0. Never negative, never
    /// past `maxDepth`.
    public static func depth(fromHeader value: Substring, anyToken: Bool = false) -> Int {
        let parts = value.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        guard let first = parts.first, let n = Int(first), n > 0 else { return 0 }
        guard anyToken || (parts.count == 2 && parts[1] == depthToken) else { return 0 }
        return min(n, maxDepth)
    }
}

/// A sub-request's answer.
public struct LuaSubresponse: Sendable {
    public var status: Int
    public var headers: [(String, String)]
    public var body: [UInt8]
    public init(status: Int, headers: [(String, String)], body: [UInt8]) {
        self.status = status
        self.headers = headers
        self.body = body
    }
}

/// `sluice.http{method, url, headers, body, timeout}` (docs/scripting.md): a sub-request
/// through this Sluice's own pipeline, the calling hook waiting for it (`LuaWait`). Answers
/// `res` (`{status, headers, body}`, `headers` a table by lower-case name, repeated fields
/// joined with ", ") or `nil, message` when the request failed (refused, timed out, a body
/// past `limits.body`). A call the entry does not allow is a script error: a host not in
/// `allow_hosts`, the admin listener, one call past `limits.subrequests`, a call where the
/// coroutine cannot be suspended (a C boundary: a `__tostring`, a `table.sort` comparator, a
/// `string.gsub` callback), a sub-request's sub-request past `LuaSubrequest.maxDepth`.
///
/// Threading: the state's thread (see `Lua` for the error discipline: only raw gets here).
enum LuaHTTP {
    static let request: Lua.Function = { L in
        let state = LuaState.of(L)
        guard lua_type(L, 1) == LUA_TTABLE else { return Lua.badArgument(L, 1, "http", "table") }
        guard let slot = state.current, let wait = slot.wait, wait.phase == .running else {
            return Lua.fail(
                L, "sluice.http is for on_request of a lua entry with allow_hosts (not every_try or read_body)")
        }
        guard lua_isyieldable(L) != 0 else {
            return Lua.fail(
                L,
                "sluice.http cannot wait here: it was called through a C function (a metamethod such as "
                    + "__tostring, a table.sort comparator, a string.gsub callback) that cannot be suspended")
        }
        guard wait.depth < LuaSubrequest.maxDepth else {
            return Lua.fail(L, "sluice.http: this request is a sub-request \(wait.depth) deep; no deeper ones")
        }
        guard wait.subrequests < slot.limits.subrequests else {
            return Lua.fail(L, "sluice.http: limits.subrequests (\(slot.limits.subrequests)) reached in this call")
        }
        // The fields, by raw gets: a metamethod could raise over this Swift frame.
        func field(_ name: String) -> Int32 {
            Lua.push(L, name)
            return lua_rawget(L, 1)
        }
        var method = "GET"
        if field("method") != LUA_TNIL {
            guard let text = Lua.bytes(L, -1), !text.isEmpty, text.allSatisfy(Self.isTokenByte) else {
                return Lua.fail(L, "sluice.http: method must be a token such as GET or POST")
            }
            method = Lua.makeString(text)
        }
        guard field("url") == LUA_TSTRING, let url = Lua.string(L, -1) else {
            return Lua.fail(L, "sluice.http: url must be a string (http://host/path)")
        }
        let parts = URLParts(url)
        let scheme = parts.scheme.lowercased()
        guard scheme == "http" || scheme == "https", url.utf8.allSatisfy({ $0 > 0x20 && $0 != 0x7F }),
            let (host, written) = LuaAllowedHost.split(authority: parts.authority)
        else {
            return Lua.fail(L, "sluice.http: url must be absolute, http:// or https://, with no user or space")
        }
        let port = written ?? (scheme == "https" ? 443 : 80)
        guard wait.allowHosts.contains(where: { $0.allows(host: host, port: port) }) else {
            return Lua.fail(L, "sluice.http: \(parts.authority) is not in this entry's lua.allow_hosts")
        }
        if let refusal = wait.host.refusal(host: host, port: port) {
            return Lua.fail(L, "sluice.http: \(parts.authority) is refused: \(refusal)")
        }
        var headers: [(String, String)] = []
        // The fields' bytes, counted against the memory cap as they are copied: a table may
        // name one long string as the value of many fields.
        var held = 0
        switch field("headers") {
        case LUA_TNIL: break
        case LUA_TTABLE:
            let table = lua_gettop(L)
            lua_pushnil(L)
            while lua_next(L, table) != 0 {
                guard let name = Lua.bytes(L, -2), !name.isEmpty, name.allSatisfy(Self.isTokenByte) else {
                    return Lua.fail(L, "sluice.http: header names must be strings of token characters")
                }
                guard let value = Lua.text(L, -1) else {
                    return Lua.fail(L, "sluice.http: header '\(Lua.printable(name))' must be a string")
                }
                held += LuaMessageAPI.heldPerField + name.count + value.count
                guard Lua.fitsCall(L, held) else { return Lua.failMemory(L) }
                guard !value.contains(where: { $0 == 0x0D || $0 == 0x0A || $0 == 0 }) else {
                    return Lua.fail(L, "sluice.http: header '\(Lua.printable(name))' holds CR, LF or NUL")
                }
                headers.append((Lua.makeString(name), Lua.makeString(value)))
                sluice_lua_pop(L, 1)
            }
        default: return Lua.fail(L, "sluice.http: headers must be a table of name = value")
        }
        var body: [UInt8]?
        switch field("body") {
        case LUA_TNIL: break
        case LUA_TSTRING:
            let bytes = Lua.bytes(L, -1)!
            guard bytes.count <= slot.limits.body else {
                return Lua.fail(L, "sluice.http: body is \(bytes.count) bytes, over limits.body (\(slot.limits.body))")
            }
            body = Array(bytes)
        default: return Lua.fail(L, "sluice.http: body must be a string")
        }
        let remaining = max(1000, state.meter.pointee.deadline_us - state.now)
        var timeout = remaining
        if field("timeout") != LUA_TNIL {
            var isNumber: Int32 = 0
            let seconds = sluice_lua_tonumber(L, -1, &isNumber)
            guard isNumber != 0, seconds > 0 else { return Lua.fail(L, "sluice.http: timeout must be seconds > 0") }
            timeout = min(remaining, Int64(min(seconds, 3600) * 1_000_000))
        }
        headers.removeAll { $0.0.lowercased() == LuaSubrequest.depthHeader.lowercased() }
        let subrequest = LuaSubrequest(
            method: method, url: url, headers: headers, body: body, timeoutMicroseconds: timeout,
            depth: wait.depth + 1, maxBody: slot.limits.body)
        wait.subrequests += 1
        let lender = wait.host
        return wait.suspend { deliver in
            lender.subrequest(subrequest) { result in
                deliver { co in push(result, onto: co) }
            }
        }
    }

    /// Pushes `res` or `nil, message`.
    private static func push(_ result: Result<LuaSubresponse, LuaOperationError>, onto co: OpaquePointer) -> Int32 {
        switch result {
        case .failure(let error):
            lua_pushnil(co)
            Lua.push(co, "sluice.http: " + error.message)
            return 2
        case .success(let response):
            lua_createtable(co, 0, 3)
            lua_pushinteger(co, lua_Integer(response.status))
            lua_setfield(co, -2, "status")
            var fields: [String: String] = [:]
            var order: [String] = []
            for (name, value) in response.headers {
                let key = name.lowercased()
                if let seen = fields[key] {
                    fields[key] = seen + ", " + value
                } else {
                    fields[key] = value
                    order.append(key)
                }
            }
            lua_createtable(co, 0, Int32(order.count))
            for key in order {
                Lua.push(co, fields[key]!)
                lua_setfield(co, -2, key)
            }
            lua_setfield(co, -2, "headers")
            Lua.push(co, bytes: response.body)
            lua_setfield(co, -2, "body")
            return 1
        }
    }

    /// A byte of an HTTP token (RFC 9110 `tchar`).
    private static func isTokenByte(_ b: UInt8) -> Bool {
        switch b {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"):
            true
        default: "!#$%&'*+-.^_`|~".utf8.contains(b)
        }
    }
}

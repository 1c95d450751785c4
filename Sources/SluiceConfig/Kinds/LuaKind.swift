import SluiceCore

/// `lua` (docs/scripting.md): a Lua script's hooks — `on_request` adapts or answers the
/// request, `on_response` the response's head (or body), `on_log` sees the ended exchange
/// (`LuaAdapter`). The script is compiled and its top level run here, once, so a syntax
/// error, a top-level error or an unknown hook is a configuration error at the entry, with the
/// script's own `name.lua:LINE: message`; `sluice check` and a reload (SIGHUP, which re-reads
/// the file) report it the same way. A relative `file` is read from the configuration file's
/// directory.
///
/// ```yaml
/// - lua: { file: sign.lua, config: { key_id: k1 }, on_error: fail_closed, limits: { instructions: 200000 } }
/// ```
///
/// `read_body` needs the script's `on_request`, `read_response_body` its `on_response`.
enum LuaKind: InterceptorKind {
    static var name: String { "lua" }

    static func read(_ settings: YAMLNode?, at entry: YAMLNode, _ reader: inout NodeReader) -> LuaAdapter? {
        guard let settings else {
            reader.fail(entry, "lua needs file or source")
            return nil
        }
        var script: LuaScript?
        var origin = ""
        var scriptNode: YAMLNode?
        var config: [String: LuaValue] = [:]
        var onError = LuaAdapter.OnError.failClosed
        var everyTry = false
        var readBody = false
        var readResponseBody = false
        var limits = LuaLimits.default
        var allowHosts: [LuaAllowedHost] = []
        var allowNode: YAMLNode?
        var configNode: YAMLNode?
        let file = reader.file
        let known = [
            "file", "source", "config", "on_error", "every_try", "read_body", "read_response_body", "limits", "allow_hosts",
        ]
        reader.entries(settings, in: "lua", known: known) { r, key, value in
            switch key {
            case "file":
                guard script == nil else { return r.fail(value, "lua takes file or source, not both") }
                scriptNode = value
                guard let path = value.scalar?.string, !path.isEmpty else { return r.fail(value, "file must be a path") }
                let resolved = Self.resolve(path, against: file)
                guard let text = FileContents.text(atPath: resolved) else {
                    return r.fail(value, "lua file '\(resolved)' is not a readable UTF-8 file")
                }
                script = LuaScript(name: FileContents.lastComponent(of: resolved), source: text)
                origin = "file \(resolved)"
            case "source":
                guard script == nil else { return r.fail(value, "lua takes file or source, not both") }
                scriptNode = value
                guard let text = value.scalar?.string else { return r.fail(value, "source must be the script's text") }
                script = LuaScript(name: "source.lua", source: text)
                origin = "source"
            case "config":
                configNode = value
                guard case .mapping = value else { return r.fail(value, "config must be a map") }
                // A value Lua cannot hold has its own error, at its line.
                if case .table(let fields)? = Self.value(value, &r) { config = fields }
            case "on_error":
                guard let choice = value.scalar.flatMap({ LuaAdapter.OnError(rawValue: $0.string) }) else {
                    return r.fail(value, "on_error must be fail_closed or fail_open")
                }
                onError = choice
            case "every_try":
                if let on = r.bool(value, key: key) { everyTry = on }
            case "read_body":
                if let on = r.bool(value, key: key) { readBody = on }
            case "read_response_body":
                if let on = r.bool(value, key: key) { readResponseBody = on }
            case "limits":
                Self.readLimits(value, into: &limits, &r)
            case "allow_hosts":
                allowNode = value
                for (text, item) in r.strings(value, what: "allow_hosts") ?? [] {
                    switch LuaAllowedHost.parse(text) {
                    case .success(let entry): allowHosts.append(entry)
                    case .failure(let error): r.fail(item, "allow_hosts: \(error.message)")
                    }
                }
            default: break
            }
        }
        guard let script, let scriptNode else {
            // A `file` or `source` that was given but not usable has its own error.
            if scriptNode == nil { reader.fail(settings, "lua needs file or source") }
            return nil
        }
        let hooks: LuaHooks
        // The script's own `every_try = true` (beside its hooks) adds to the key: either asks.
        var declared = false
        do throws(LuaLoadError) {
            // Compiled and run once on a throwaway state: the workers build their own.
            let state = try LuaState.load(script, limits: limits)
            hooks = state.hooks
            declared = state.declaresEveryTry
            if (everyTry || declared) && !state.hasOnRequest {
                reader.fail(scriptNode, "every_try is for on_request, which \(script.name) does not define")
                return nil
            }
            if readBody && !state.hasOnRequest {
                reader.fail(scriptNode, "read_body is for on_request, which \(script.name) does not define")
                return nil
            }
            if readResponseBody && !state.hasOnResponse {
                reader.fail(scriptNode, "read_response_body is for on_response, which \(script.name) does not define")
                return nil
            }
            if let configNode, !config.isEmpty {
                let used = state.memoryInUse(with: LuaConfig(config))
                if used > limits.memory {
                    reader.fail(
                        configNode,
                        "config needs \(used) bytes in the script's state, over limits.memory (\(limits.memory)): every call would fail; raise limits.memory or shorten config"
                    )
                    return nil
                }
            }
        } catch {
            reader.fail(scriptNode, "lua script does not load: \(error.message)")
            return nil
        }
        if let allowNode, everyTry || declared || readBody {
            // Those hooks run inside a try, which cannot wait for a sub-request.
            let asked = everyTry || readBody ? "" : " (\(script.name) returns every_try = true)"
            reader.fail(
                allowNode,
                "allow_hosts (sluice.http) is for a hook that runs once per exchange, not every_try or read_body\(asked)")
            return nil
        }
        everyTry = everyTry || declared
        return LuaAdapter(
            script: script, origin: origin, config: LuaConfig(config), limits: limits, onError: onError,
            everyTry: everyTry, readBody: readBody, readResponseBody: readResponseBody, allowHosts: allowHosts,
            hooks: hooks)
    }

    static func describe(_ a: LuaAdapter) -> String {
        var parts = [
            "\(a.origin) (sha256 \(a.script.contentHash.prefix(12)))", "on_error \(a.onError.rawValue)",
            "instructions \(a.limits.instructions)", "memory \(a.limits.memory)",
            "wall \(a.limits.wall.components.seconds * 1000 + a.limits.wall.components.attoseconds / 1_000_000_000_000_000) ms",
            "body \(a.limits.body)", "subrequests \(a.limits.subrequests)",
        ]
        if a.everyTry { parts.append("every try") }
        if a.readBody { parts.append("reads the body") }
        if a.readResponseBody { parts.append("reads the response body") }
        if !a.allowHosts.isEmpty { parts.append("allow_hosts " + a.allowHosts.map(\.description).joined(separator: ", ")) }
        if !a.config.values.isEmpty { parts.append("config keys " + a.config.values.keys.sorted().joined(separator: ", ")) }
        return parts.joined(separator: ", ")
    }

    /// `path` as given when absolute, else beside the configuration file.
    static func resolve(_ path: String, against configFile: String) -> String {
        FileContents.path(path, besideFile: configFile)
    }

    private static func readLimits(_ node: YAMLNode, into limits: inout LuaLimits, _ reader: inout NodeReader) {
        let known = ["instructions", "memory", "wall", "subrequests", "body"]
        reader.entries(node, in: "lua limits", known: known) { r, key, value in
            switch key {
            case "instructions":
                if let n = r.count(value, key: key, min: 1000) { limits.instructions = n }
            case "memory":
                if let n = r.size(value, key: key, min: 256 << 10) { limits.memory = Int(n) }
            case "wall":
                if let ms = r.duration(value, key: key) { limits.wall = .milliseconds(ms) }
            case "subrequests":
                if let n = r.count(value, key: key, min: 0) { limits.subrequests = n }
            case "body":
                if let n = r.size(value, key: key, min: 0) { limits.body = Int(n) }
            default: break
            }
        }
    }

    /// A YAML value as `ctx.config` holds it; nil (with an error) for what Lua cannot hold. A
    /// string that is a whole `${NAME}` is the environment variable's value, a secret (an unset
    /// one is an error, and logs redact the value) — as in a header adapter's value; a plain
    /// `null` (or `~`) is refused, since Lua would see the key as absent.
    static func value(_ node: YAMLNode, _ reader: inout NodeReader) -> LuaValue? {
        switch node {
        case .scalar(let scalar):
            if let b = scalar.bool { return .bool(b) }
            if let i = scalar.int { return .integer(i) }
            if let d = scalar.float { return .number(d) }
            if scalar.style == .plain && (scalar.string.isEmpty || NodeReader.nullWords.contains(scalar.string)) {
                reader.fail(
                    node, "config values are strings, numbers, booleans, lists and maps: leave a key out rather than null")
                return nil
            }
            if scalar.string.hasPrefix("${") && scalar.string.hasSuffix("}") {
                return reader.secret(node, what: "config value").map { .string($0.value) }
            }
            return .string(scalar.string)
        case .sequence(let items):
            var out: [LuaValue] = []
            for item in items {
                guard let v = value(item, &reader) else { return nil }
                out.append(v)
            }
            return .array(out)
        case .mapping(let mapping):
            var out: [String: LuaValue] = [:]
            for (k, v) in mapping {
                guard let key = k.scalar?.string else {
                    reader.fail(k, "config keys must be strings")
                    return nil
                }
                guard let value = value(v, &reader) else { return nil }
                out[key] = value
            }
            return .table(out)
        }
    }
}

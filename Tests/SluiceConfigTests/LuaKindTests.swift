import Foundation
import HTTPTypes
import Testing

@testable import SluiceConfig
@testable import SluiceCore

/// The `lua` kind (docs/scripting.md): a script that does not load is a located configuration
/// error carrying the script's own message; a relative `file` is read beside the
/// configuration; the adapter maps the script's edits back onto the request, and a failed
/// script answers `luaScriptFailed` (fail_closed) or leaves the request alone (fail_open).
@Suite struct LuaKindTests {
    static func policy(_ entry: String, file: String = "t.yaml") throws -> HostPolicy {
        let yaml = "policies:\n  h.test:\n    adapters:\n      - lua: \(entry)\n"
        return try ConfigLoader.parse(yaml: yaml, file: file).pipeline.policies.match(host: "h.test")
    }

    static func issue(_ entry: String) -> ConfigIssue? {
        do {
            _ = try policy(entry)
            return nil
        } catch {
            return (error as? ConfigError)?.issues.first
        }
    }

    static func request(_ url: String = "http://h.test/a?b=1") -> ProxyRequest {
        ProxyRequest(id: 7, method: "GET", url: url, headerFields: [.init("X-Client")!: "c1"], body: .none)
    }

    @Test func aScriptThatDoesNotCompileIsALocatedError() throws {
        let issue = try #require(Self.issue(#"{ source: "return { on_request = function(req) x = end }" }"#))
        #expect(issue.line == 4)
        #expect(issue.message.contains("lua script does not load: source.lua:1:"))
    }

    @Test func anUnknownHookIsAnError() throws {
        let issue = try #require(Self.issue(#"{ source: "return { on_reqest = function() end }" }"#))
        #expect(issue.message.contains("unknown hook 'on_reqest'"))
    }

    @Test func settingsAreChecked() throws {
        #expect(Self.issue("{ }")?.message.contains("lua needs file or source") == true)
        #expect(Self.issue(#"{ source: "return {}", on_error: maybe }"#)?.message.contains("fail_closed or fail_open") == true)
        #expect(Self.issue(#"{ source: "return {}", limits: { instructions: 5 } }"#) != nil)
        #expect(Self.issue(#"{ source: "return {}", file: x.lua }"#)?.message.contains("not both") == true)
    }

    /// A whole `${NAME}` in `config` is the variable's value, as in a header adapter's value;
    /// an unset one is an error at its line, and so is a plain `null` (Lua would see no key).
    @Test func configTakesEnvironmentReferencesAndRefusesNull() throws {
        setenv("SLUICE_TEST_LUA_TOKEN", "t-from-env", 1)
        let policy = try Self.policy(
            #"{ source: "return { on_request = function(req, ctx) req.headers:set('X-T', ctx.config.t .. ctx.config.list[1]) end }", config: { t: "${SLUICE_TEST_LUA_TOKEN}", list: ["${SLUICE_TEST_LUA_TOKEN}"] } }"#
        )
        var request = Self.request()
        #expect(try policy.adapters[0].adapter.adaptInPlace(&request))
        #expect(request.headerFields[HTTPField.Name("X-T")!] == "t-from-envt-from-env")
        _ = LuaStateCache.takeLastCall()
        let unset = try #require(Self.issue(#"{ source: "return {}", config: { t: "${SLUICE_TEST_LUA_UNSET}" } }"#))
        #expect(unset.message.contains("environment variable SLUICE_TEST_LUA_UNSET is not set"))
        #expect(unset.line == 4)
        // Quoted, `null` is a string.
        let quoted = try Self.policy(
            #"{ source: "return { on_request = function(req, ctx) req.headers:set('X-N', ctx.config.n) end }", config: { n: "null" } }"#
        )
        request = Self.request()
        #expect(try quoted.adapters[0].adapter.adaptInPlace(&request))
        #expect(request.headerFields[HTTPField.Name("X-N")!] == "null")
        _ = LuaStateCache.takeLastCall()
        for plain in ["null", "~", ""] {
            let issue = try #require(Self.issue(#"{ source: "return {}", config: { n: \#(plain) } }"#))
            #expect(issue.message.contains("leave a key out rather than null"), "\(issue.message)")
        }
    }

    /// A `config` whose table does not fit under `limits.memory` beside the script would fail
    /// every call: an error at `config`, not a 502 for every request.
    @Test func aConfigOverTheMemoryLimitIsAnError() throws {
        let items = (0..<6000).map { "item-number-\($0)" }.joined(separator: ", ")
        let issue = try #require(
            Self.issue(
                #"{ source: "return { on_request = function() end }", limits: { memory: 256KiB }, config: { items: [\#(items)] } }"#
            ))
        #expect(issue.message.contains("over limits.memory (262144)"), "\(issue.message)")
        _ = try Self.policy(
            #"{ source: "return { on_request = function() end }", limits: { memory: 8MiB }, config: { items: [\#(items)] } }"#)
    }

    /// A `file` that cannot be read is one error, at the file, not a second "needs file".
    @Test func anUnreadableFileIsOneError() throws {
        do {
            _ = try Self.policy("{ file: /nonexistent/missing.lua }")
            Issue.record("a missing file loaded")
        } catch let error as ConfigError {
            #expect(error.issues.count == 1, "\(error.issues)")
            #expect(error.issues.first?.message.contains("is not a readable UTF-8 file") == true)
        }
    }

    @Test func aRelativeFileIsReadBesideTheConfiguration() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("lua-kind-\(getpid())")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        try #"return { on_request = function(req, ctx) req.headers:set("X-Seen", ctx.config.tag) end }"#
            .write(to: dir.appendingPathComponent("seen.lua"), atomically: true, encoding: .utf8)
        let policy = try Self.policy("{ file: seen.lua, config: { tag: t1 } }", file: dir.appendingPathComponent("s.yaml").path)
        #expect(policy.adapterNames == ["lua"])
        var request = Self.request()
        #expect(try policy.adapters[0].adapter.adaptInPlace(&request))
        #expect(request.headerFields[HTTPField.Name("X-Seen")!] == "t1")
        let config = try ConfigLoader.parse(
            yaml: "policies:\n  h.test:\n    adapters:\n      - lua: { file: seen.lua }\n",
            file: dir.appendingPathComponent("s.yaml").path)
        #expect(PolicyDescription.describe(config.pipeline, host: "h.test").contains("lua: file /"))
    }

    @Test func editsReachTheRequest() throws {
        let policy = try Self.policy(
            #"""
            { source: "return { on_request = function(req) req.method = 'POST'; req.path = '/v2' .. req.path; req.query = 'c=2'; req.headers:remove('X-Client') end }" }
            """#)
        var request = Self.request()
        #expect(try policy.adapters[0].adapter.adaptInPlace(&request))
        #expect(request.method == "POST")
        #expect(request.url == "http://h.test/v2/a?c=2")
        #expect(request.headerFields[HTTPField.Name("X-Client")!] == nil)
        #expect(LuaStateCache.takeLastCall()?.outcome == "ok")
    }

    /// The hooks are those the script's table defined when the configuration read it: a
    /// policy whose scripts define no `on_response` runs no response stage for them.
    @Test func theHooksAreThoseTheConfigurationFound() throws {
        let request = try Self.policy(#"{ source: "return { on_request = function(req) end }" }"#)
        #expect((request.adapters[0].adapter as? LuaAdapter)?.hooks == [.onRequest])
        #expect(request.runsScripts && !request.runsResponseScripts)
        let later = try Self.policy(#"{ source: "return { on_response = function(res) end, on_log = function() end }" }"#)
        #expect((later.adapters[0].adapter as? LuaAdapter)?.hooks == [.onResponse, .onLog])
        #expect(later.runsResponseScripts)
    }

    @Test func theURLIsSplitOnItsBytes() {
        for (url, origin, path, query) in [
            ("http://h.test/a/b?c=1#f", "http://h.test", "/a/b", "c=1"), ("http://h.test", "http://h.test", "", nil),
            ("http://u@h.test:8080?x", "http://u@h.test:8080", "", "x"), ("https://h.test/é?", "https://h.test", "/é", ""),
        ] as [(String, String, String, String?)] {
            let target = LuaAdapter.Target(url)
            #expect(target.origin == origin && target.path == path && target.query == query, "\(url)")
        }
    }

    @Test func aFailedScriptFailsClosedOrOpen() throws {
        let source = #"source: "return { on_request = function(req) req.headers:set('X-A', 'v'); error('boom') end }""#
        let closed = try Self.policy("{ \(source) }")
        var request = Self.request()
        #expect {
            _ = try closed.adapters[0].adapter.adaptInPlace(&request)
        } throws: { error in
            guard let error = error as? AdaptationError else { return false }
            return error.proxyError == .luaScriptFailed(script: "source.lua", requestID: 7)
                && error.reason.contains("source.lua:1: boom") && !error.proxyError.message.contains("boom")
        }
        let call = try #require(LuaStateCache.takeLastCall())
        #expect(call.outcome == "error" && call.error?.contains("boom") == true)

        let open = try Self.policy("{ \(source), on_error: fail_open }")
        request = Self.request()
        #expect(try open.adapters[0].adapter.adaptInPlace(&request))
        #expect(request.headerFields[HTTPField.Name("X-A")!] == nil)
    }

    @Test func aRunawayScriptIsStoppedByItsLimit() throws {
        let policy = try Self.policy(#"{ source: "return { on_request = function() while true do end end }" }"#)
        var request = Self.request()
        #expect(throws: AdaptationError.self) { _ = try policy.adapters[0].adapter.adaptInPlace(&request) }
        #expect(LuaStateCache.takeLastCall()?.outcome == "limit")
    }

    /// `read_response_body` needs `on_response` (a located error without it); its policy
    /// keeps bodies up to the largest `limits.body` of its reading scripts; a policy without
    /// it keeps none. A policy whose scripts see the request or the response bypasses the
    /// shared cache; one whose scripts have `on_log` alone keeps it.
    @Test func readResponseBodyNeedsOnResponseAndBypassesTheCache() throws {
        let issue = try #require(
            Self.issue(#"{ source: "return { on_request = function(req) end }", read_response_body: true }"#))
        #expect(issue.line == 4 && issue.column > 0)
        #expect(issue.message.contains("read_response_body is for on_response, which source.lua does not define"))

        let policy = try Self.policy(
            #"{ source: "return { on_response = function(res) end }", read_response_body: true, limits: { body: 64KiB } }"#)
        #expect(policy.responseBodyLimit == 64 << 10)
        #expect(policy.cache == .doNotCache)
        let streaming = try Self.policy(#"{ source: "return { on_response = function(res) end }" }"#)
        #expect(streaming.responseBodyLimit == nil && streaming.cache == .doNotCache)
        #expect(try Self.policy(#"{ source: "return { on_request = function(req) end }" }"#).cache == .doNotCache)
        #expect(try Self.policy(#"{ source: "return { on_log = function(ctx) end }" }"#).cache == .cache)
    }

    @Test func theScriptCanAskToRunOnEveryTry() throws {
        // `every_try = true` in the hooks table: the same as the YAML key.
        let declared = try Self.policy(#"{ source: "return { every_try = true, on_request = function(req) end }" }"#)
        #expect(declared.tryAdapters.map(\.name) == ["lua"])
        let once = try Self.policy(#"{ source: "return { every_try = false, on_request = function(req) end }" }"#)
        #expect(once.tryAdapters.isEmpty && once.adapterNames == ["lua"])
        #expect(
            Self.issue(#"{ source: "return { every_try = 1, on_request = function(req) end }" }"#)?.message
                .contains("every_try is a number, not a boolean") == true)
        // A hook that runs inside a try cannot wait for a sub-request, whoever asked for it: the
        // refusal is at `allow_hosts` and says that the script asked.
        let entry = #"{ source: "return { every_try = true, on_request = function(req) end }", allow_hosts: [a.test] }"#
        let refused = try #require(Self.issue(entry))
        #expect(refused.message.contains("allow_hosts (sluice.http) is for a hook that runs once per exchange"))
        #expect(refused.message.hasSuffix("(source.lua returns every_try = true)"))
        let line = "      - lua: " + entry
        #expect(refused.line == 4)
        #expect(refused.column == line.distance(from: line.startIndex, to: line.range(of: "[a.test]")!.lowerBound) + 1)
        // Either way of asking needs on_request.
        #expect(
            Self.issue(#"{ source: "return { every_try = true, on_response = function(res) end }" }"#)?.message
                .contains("every_try is for on_request, which source.lua does not define") == true)
        #expect(
            Self.issue(#"{ source: "return { on_response = function(res) end }", every_try: true }"#)?.message
                .contains("every_try is for on_request, which source.lua does not define") == true)
    }

    @Test func everyTryAndReadBodyChooseTheTiming() throws {
        let policy = try Self.policy(#"{ source: "return { on_request = function(req) end }", read_body: true }"#)
        #expect(policy.tryAdapters.map(\.name) == ["lua"])
        #expect(policy.bodyReader == "lua")
        #expect(policy.runsScripts)
    }
}

import SluiceConfig
import SluiceCore
import Testing

/// `HostPolicy.scriptsOnLines`: a policy whose once-per-exchange adapters are scripts that
/// never wait (after header adapters) runs them on the forwarded request's lines, unless
/// something else needs the request model or adapts the request again.
struct LuaScriptsOnLinesTests {
    static let script = #"      - lua: { source: "return { on_request = function(req) end }" }"# + "\n"

    static func policy(_ adapters: String, _ more: String = "") throws -> HostPolicy {
        try LuaHeaderPlanTests.policy(adapters + more)
    }

    @Test func scriptsAloneOrAfterHeaderAdaptersRunOnLines() throws {
        #expect(try Self.policy(Self.script).scriptsOnLines)
        #expect(
            try Self.policy("      - headers: { set: { X-A: a } }\n      - bearer: t\n" + Self.script + Self.script)
                .scriptsOnLines)
    }

    @Test func anythingThatNeedsTheModelKeepsIt() throws {
        for (adapters, more) in [
            ("      - headers: { set: { X-A: a } }\n", ""),
            (Self.script + "      - headers: { set: { X-A: a } }\n", ""),
            (#"      - lua: { source: "return { on_request = function(req) end }", every_try: true }"# + "\n", ""),
            (#"      - lua: { source: "return { on_request = function(req) end }", allow_hosts: [a.test] }"# + "\n", ""),
            (Self.script, "    retry: {}\n"),
            (Self.script, "    redirect: { follow: { max: 5 } }\n"),
            (Self.script, "    rate_limit: { rate: 100/s, burst: 10 }\n"),
        ] {
            #expect(try !Self.policy(adapters, more).scriptsOnLines, "\(adapters)\(more)")
        }
        #expect(try Self.policy(Self.script, "    rate_limit: { rate: 100/s, burst: 10, learn: false }\n").scriptsOnLines)
    }
}

import SluiceConfig
import SluiceCore
import Testing

/// `HostPolicy.modelHeaderPlan`: header adapters before `lua` scripts are made into one plan
/// applied as the model's fields are built, and only the scripts stay in the interceptor; any
/// other mix keeps every adapter there.
struct LuaHeaderPlanTests {
    static func policy(_ adapters: String) throws -> HostPolicy {
        let yaml = "policies:\n  h.test:\n    adapters:\n" + adapters
        return try ConfigLoader.parse(yaml: yaml, file: "t.yaml").pipeline.policies.match(host: "h.test")
    }

    static let script = #"      - lua: { source: "return { on_request = function(req) end }" }"# + "\n"

    @Test func headerAdaptersBeforeScriptsBecomeThePlan() throws {
        let policy = try Self.policy(
            "      - headers: { set: { X-A: a }, remove: [X-B] }\n      - bearer: tok\n" + Self.script + Self.script)
        #expect(policy.interceptor.adapters.map(\.name) == ["lua", "lua"])
        let replaced = Set(policy.modelHeaderPlan?.replacedNames ?? [])
        #expect(replaced == [Array("x-a".utf8), Array("x-b".utf8), Array("authorization".utf8)])
        #expect(policy.modelHeaderFields.map { "\($0.name.rawName): \($0.value)" } == ["X-A: a", "Authorization: Bearer tok"])
        #expect(policy.adapterNames == ["headers", "bearer", "lua", "lua"])
    }

    @Test func anyOtherMixKeepsEveryAdapter() throws {
        for adapters in [
            Self.script + "      - headers: { set: { X-A: a } }\n",
            "      - headers: { set: { X-A: a } }\n",
            "      - api_key: { query: key, value: v }\n" + Self.script,
            Self.script,
        ] {
            let policy = try Self.policy(adapters)
            #expect(policy.modelHeaderPlan == nil, "\(adapters)")
            #expect(policy.interceptor.adapters.count == policy.adapters.count, "\(adapters)")
        }
    }
}

import HTTPTypes
import Testing

@testable import SluiceCore

/// The script-facing API (`req`, `res`, `ctx`, `sluice`) round-trips to the Swift views, and
/// the per-worker cache shares one state among the policies of one script.
@Suite struct LuaAPITests {
    @Test func requestFieldsAndHeadersRoundTrip() throws {
        let source = """
            return { on_request = function(req, ctx)
              assert(req.method == 'GET' and req.path == '/v1/items' and req.query == 'page=2')
              assert(req.headers:get('x-api-key') == 'k1' and req.headers:get('X-API-KEY') == 'k1')
              assert(req.headers:get('missing') == nil)
              req.method = 'POST'
              req.path = '/v2/items'
              req.query = nil
              req.headers:set('X-Tenant', 't-' .. req.headers:get('x-api-key'))
              req.headers:add('Via', 'a')
              req.headers:add('via', 'b')
              assert(req.headers:get('via') == 'a, b')
              local all = req.headers:get_all('VIA')
              assert(#all == 2 and all[1] == 'a' and all[2] == 'b')
              req.headers:remove('accept')
              req.headers:set('x-api-key', nil)
              local names = {}
              for name, value in req.headers:each() do names[#names + 1] = name .. '=' .. value end
              assert(table.concat(names, ';') == 'X-Tenant=t-k1;Via=a;via=b', table.concat(names, ';'))
              assert(req:body() == nil)
              local ok, err = pcall(req.set_body, req, '{"a":1}')
              assert(not ok and err:find('req:set_body needs read_body: true', 1, true), err)
            end }
            """
        let (result, request) = try LuaTest.onRequest(source)
        #expect(result.outcome == .ok)
        #expect(request.method == "POST" && request.path == "/v2/items" && request.query == nil)
        #expect(request.headers.map { "\($0.name.rawName)=\($0.value)" } == ["X-Tenant=t-k1", "Via=a", "via=b"])
        #expect(request.body == nil)
        #expect(result.respond == nil)
    }

    @Test func setBodyReplacesABodyThatWasRead() throws {
        let post = LuaRequestView(method: "POST", path: "/", body: Array(#"{"a":1}"#.utf8))
        let (result, request) = try LuaTest.onRequest(
            """
            return { on_request = function(req)
              local t = sluice.json.decode(req:body())
              t.b = 2
              req:set_body(sluice.json.encode(t))
            end }
            """, post)
        #expect(result.outcome == .ok)
        let json = try #require(request.body.map { String(decoding: $0, as: UTF8.self) })
        #expect(json == #"{"a":1,"b":2}"# || json == #"{"b":2,"a":1}"#)
    }

    @Test func respondRefusesAnInterimStatusAndFramingFields() throws {
        let (interim, _) = try LuaTest.onRequest("return { on_request = function(req) req:respond(103) end }")
        #expect(
            interim.outcome == .error("test.lua:1: bad argument #1 to 'respond' (a final status from 200 to 599 expected)"))
        for name in ["Content-Length", "transfer-encoding", "Connection", "Upgrade"] {
            let (framed, _) = try LuaTest.onRequest(
                "return { on_request = function(req) req:respond(200, { ['\(name)'] = '1' }, 'x') end }")
            #expect(framed.outcome == .error("test.lua:1: req:respond cannot set '\(name)' (Sluice frames the answer itself)"))
            #expect(framed.respond == nil)
        }
    }

    @Test func headerInjectionIsRefusedNamingTheHeader() throws {
        for (value, name) in [("'a\\r\\nX-Evil: 1'", "X-Sig"), ("'a\\nb'", "X-Sig"), ("'a\\0b'", "X-Sig")] {
            let (result, request) = try LuaTest.onRequest(
                "return { on_request = function(req) req.headers:set('X-Other', 'fine') req.headers:set('\(name)', \(value)) end }"
            )
            #expect(result.outcome == .error("test.lua:1: header 'X-Sig' value contains CR, LF or NUL"))
            #expect(request == LuaTest.get())
        }
        let (badName, _) = try LuaTest.onRequest("return { on_request = function(req) req.headers:add('X-A\\r\\nB', 'v') end }")
        #expect(badName.outcome == .error("test.lua:1: invalid header name 'X-A\\x0d\\x0aB'"))
        let (respond, _) = try LuaTest.onRequest(
            "return { on_request = function(req) req:respond(200, { ['x-a'] = 'v\\r\\n' }) end }")
        #expect(respond.outcome == .error("test.lua:1: header 'x-a' value contains CR, LF or NUL"))
        let (path, _) = try LuaTest.onRequest("return { on_request = function(req) req.path = '/a b' end }")
        #expect(path.outcome.message.contains("req.path"))
    }

    @Test func editsInPlaceWhenTheCallerNeedNotRestore() throws {
        let state = try LuaTest.load(
            "return { on_request = function(req) req.headers:set('x-a', '1') if req.method == 'POST' then error('no') end end }")
        // fail_open keeps the request as it was; fail_closed lets the script edit it in place.
        var kept = LuaRequestView(method: "POST", path: "/")
        #expect(!state.makeExchange().onRequest(&kept).outcome.isOK)
        #expect(kept.headers.isEmpty)
        var edited = LuaRequestView(method: "POST", path: "/")
        #expect(!state.makeExchange().onRequest(&edited, restoringOnFailure: false).outcome.isOK)
        #expect(edited.headers[HTTPField.Name("x-a")!] == "1")
        var ok = LuaRequestView(method: "GET", path: "/")
        #expect(state.makeExchange().onRequest(&ok, restoringOnFailure: false).outcome == .ok)
        #expect(ok.headers[HTTPField.Name("x-a")!] == "1" && ok.method == "GET")
    }

    @Test func respondAnswersInsteadOfSending() throws {
        let (result, _) = try LuaTest.onRequest(
            """
            return { on_request = function(req)
              req:respond(403, { ['Content-Type'] = 'text/plain', ['Set-Cookie'] = { 'a=1', 'b=2' } }, 'denied')
            end }
            """)
        #expect(result.outcome == .ok)
        let answer = try #require(result.respond)
        #expect(answer.status == 403 && answer.body == Array("denied".utf8))
        #expect(answer.headers[.contentType] == "text/plain")
        #expect(answer.headers[values: .setCookie] == ["a=1", "b=2"])
    }

    @Test func responseHooksEditAndAskForRetry() throws {
        let state = try LuaTest.load(
            """
            return { on_response = function(res, ctx)
              assert(res.status == 503 and res.headers:get('retry-after') == '1')
              assert(not pcall(function() res.status = 200 end))
              res.headers:set('X-Seen', 'yes')
              res:set_body(res:body() .. '!')
              if res.status >= 500 then res:retry() end
            end }
            """)
        var response = LuaResponseView(status: 503, headers: [.retryAfter: "1"], body: Array("busy".utf8))
        let result = state.makeExchange().onResponse(&response)
        #expect(result.outcome == .ok && result.retry)
        #expect(response.headers[HTTPField.Name("x-seen")!] == "yes" && response.body == Array("busy!".utf8))
    }

    @Test func contextCarriesConfigAndVarsAcrossHooks() throws {
        let state = try LuaTest.load(
            """
            return {
              on_request = function(req, ctx)
                ctx.vars.tenant = ctx.config.tenants[req.headers:get('x-api-key')]
                ctx.started = ctx.config.limit
                assert(not pcall(function() ctx.config.limit = 0 end))
                assert(not pcall(function() ctx.config.tenants.k9 = 'x' end))
                assert(#ctx.config.hosts == 2 and ctx.config.hosts[2] == 'b')
              end,
              on_response = function(res, ctx) ctx.vars.status = res.status ctx.vars.limit = ctx.started end,
              on_log = function(ctx) ctx.vars.logged = true end,
            }
            """)
        let config = LuaConfig([
            "tenants": .table(["k1": .string("acme")]), "limit": .integer(5), "hosts": .array([.string("a"), .string("b")]),
        ])
        let exchange = state.makeExchange(config: config)
        var request = LuaTest.get()
        #expect(exchange.onRequest(&request).outcome == .ok)
        var response = LuaResponseView(status: 200)
        #expect(exchange.onResponse(&response).outcome == .ok)
        #expect(exchange.onLog().outcome == .ok)
        #expect(
            exchange.vars() == ["tenant": .string("acme"), "status": .integer(200), "limit": .integer(5), "logged": .bool(true)])
        // Another exchange starts with empty vars.
        let other = state.makeExchange(config: config)
        #expect(other.onLog().outcome == .ok)
        #expect(other.vars() == ["logged": .bool(true)])
    }

    @Test func aRecycledContextStartsClean() throws {
        let state = try LuaTest.load(
            """
            return { on_request = function(req, ctx)
              assert(ctx.left == nil and next(ctx.vars) == nil and getmetatable(ctx) == nil, 'dirty ctx')
              assert(getmetatable(ctx.vars) == nil and ctx.vars.tenant == nil, 'dirty ctx.vars')
              assert(ctx.config.name == req.headers:get('x-api-key'))
              ctx.left = true
              ctx.vars.seen = true
              setmetatable(ctx, { __newindex = function() error('trap') end, __index = function() error('trap') end })
              setmetatable(ctx.vars, { __index = { tenant = 'leaked' } })
            end }
            """)
        for key in ["k1", "k2", "k1"] {
            var request = LuaTest.get([HTTPField.Name("X-Api-Key")!: key])
            let exchange = state.makeExchange(config: LuaConfig(["name": .string(key)]))
            #expect(exchange.onRequest(&request).outcome == .ok)
            #expect(exchange.vars() == ["seen": .bool(true)])
        }
    }

    @Test func messagesKeptPastTheirCallAreDead() throws {
        let state = try LuaTest.load(
            """
            return {
              on_request = function(req, ctx) ctx.req = req end,
              on_response = function(res, ctx) return ctx.req.path end,
            }
            """)
        let exchange = state.makeExchange()
        var request = LuaTest.get()
        #expect(exchange.onRequest(&request).outcome == .ok)
        var response = LuaResponseView(status: 200)
        #expect(exchange.onResponse(&response).outcome.message.contains("req used outside its call"))
    }

    @Test func sluiceModuleFunctions() throws {
        #expect(
            try LuaTest.evaluate("sluice.hex.encode(sluice.sha256('abc'))")
                == .string("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"))
        // RFC 4231, test case 2.
        #expect(
            try LuaTest.evaluate("sluice.hex.encode(sluice.hmac_sha256('Jefe', 'what do ya want for nothing?'))")
                == .string("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"))
        #expect(try LuaTest.evaluate("sluice.base64.encode('hello')") == .string("aGVsbG8="))
        #expect(try LuaTest.evaluate("sluice.base64.decode('aGVsbG8=')") == .string("hello"))
        #expect(try LuaTest.evaluate("select(2, sluice.base64.decode('*'))") == .string("invalid base64"))
        #expect(try LuaTest.evaluate("sluice.hex.decode('68692A')") == .string("hi*"))
        #expect(try LuaTest.evaluate("select(2, sluice.hex.decode('6'))") == .string("invalid hex"))
        #expect(
            try LuaTest.evaluate(#"sluice.json.encode({ b = { 1, 2.5, 'x\n' }, a = true, n = sluice.json.null, e = {} })"#)
                == .string(#"{"a":true,"b":[1,2.5,"x\n"],"e":{},"n":null}"#))
        #expect(
            try LuaTest.evaluate(
                #"(function() local v = sluice.json.decode('{"a":[1,{"b":"\\u00e9\\ud83d\\ude00"}],"n":null,"f":-1.5e2}') return v.a[2].b .. v.f .. tostring(v.n == sluice.json.null) end)()"#
            ) == .string("é😀-150.0true"))
        #expect(
            try LuaTest.evaluate(#"select(2, sluice.json.decode('{"a" 1}'))"#) == .string("json.decode: expected ':' at byte 6"))
        #expect(try LuaTest.evaluate("select(2, pcall(sluice.json.encode, { f = print }))") != nil)
        #expect(
            try LuaTest.evaluate("(function() local t = {} t.t = t return select(2, pcall(sluice.json.encode, t)) end)()")
                == .string("[string \"sandbox\"]:1: json.encode: nesting deeper than 64 (a cycle?)")
                || LuaTest.evaluate("(function() local t = {} t.t = t return pcall(sluice.json.encode, t) end)()") == .bool(false)
        )
    }

    @Test func nowAndLogUseTheInjectedClockAndSink() throws {
        nonisolated(unsafe) var lines: [LuaLogLine] = []
        let clock = LuaClock(epoch: { 1_700_000_000_250_000 })
        let state = try LuaState.load(
            LuaTest.script(
                """
                return { on_request = function(req)
                  sluice.log.info('now', sluice.now())
                  sluice.log.warn('bad key', 42, nil, true)
                end }
                """, name: "sign.lua"), clock: clock, log: { lines.append($0) })
        var request = LuaTest.get()
        #expect(state.makeExchange(requestID: 77).onRequest(&request).outcome == .ok)
        #expect(
            lines == [
                LuaLogLine(level: .info, script: "sign.lua", line: 2, requestID: 77, message: "now 1700000000.25"),
                LuaLogLine(level: .warn, script: "sign.lua", line: 3, requestID: 77, message: "bad key 42 nil true"),
            ])
    }

    @Test func policiesSharingAScriptShareOneState() throws {
        let cache = LuaStateCache()
        let source = "return { on_request = function(req, ctx) req.headers:set('x-policy', ctx.config.name) end }"
        var states: [LuaState] = []
        for i in 0..<100 {
            // The same file, a hundred policies each with its own config: one state.
            let state = try cache.state(for: LuaScript(name: "policy.lua", source: source))
            let config = LuaConfig(["name": .string("p\(i)")])
            var request = LuaTest.get()
            #expect(state.makeExchange(config: config).onRequest(&request).outcome == .ok)
            #expect(request.headers[HTTPField.Name("x-policy")!] == "p\(i)")
            states.append(state)
        }
        #expect(cache.count == 1)
        #expect(states.allSatisfy { $0 === states[0] })
        #expect(states[0].slotCount == 1)
        // A different script is a different state.
        _ = try cache.state(for: LuaScript(name: "other.lua", source: source + " "))
        #expect(cache.count == 2)
    }

    /// The same text in two files is two states: a state's chunk is named after its file, and
    /// an error or a log line of one must not name the other.
    @Test func theSameTextInTwoFilesIsNamedAfterEach() throws {
        let cache = LuaStateCache()
        let source = "return { on_request = function(req, ctx) error('boom') end }"
        let a = try cache.state(for: LuaScript(name: "a.lua", source: source))
        let b = try cache.state(for: LuaScript(name: "b.lua", source: source))
        #expect(a !== b && cache.count == 2)
        func message(_ state: LuaState) -> String? {
            var request = LuaTest.get()
            if case .error(let text) = state.makeExchange().onRequest(&request).outcome { return text }
            return nil
        }
        #expect(message(b)?.hasPrefix("b.lua:1: boom") == true, "\(String(describing: message(b)))")
        #expect(message(a)?.hasPrefix("a.lua:1: boom") == true, "\(String(describing: message(a)))")
    }

    @Test func aScriptWithoutAHookCostsNothing() throws {
        let state = try LuaTest.load("return { on_log = function() end }")
        var request = LuaTest.get()
        let result = state.makeExchange().onRequest(&request)
        #expect(result == LuaCallResult())
        #expect(state.slotCount == 0)
    }
}

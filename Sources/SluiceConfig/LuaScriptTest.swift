import HTTPTypes
import SluiceCore

/// `sluice lua test SCRIPT --request FILE [--response FILE] [--config FILE]`
/// (docs/scripting.md, "Testing a script"): runs a script's hooks against HTTP/1.1 messages
/// written in files, outside any proxy, and prints what they made of them: first each call's
/// outcome and cost (with the script's `sluice.log` lines as they come), then the sections
/// `--- request` (after `on_request`; or `--- answered by req:respond`), `--- response`
/// (after `on_response`) and `--- log` (each call's access-log `lua` field, `ctx.vars`
/// included), so that a script can have its own tests. The hooks share one `ctx`, as they do for one exchange; the limits are
/// the defaults.
///
/// A message file is a request or a status line, header lines, an empty line and the body
/// (the rest of the file, taken as it is: no chunked decoding); lines may end in CRLF or LF.
/// With `--allow-host` (the entry's `allow_hosts`), `on_request` may call `sluice.http`: each
/// call is answered by the next `--http` file, in order (`FileAnswers`), and printed as it is
/// made; a call past the last file gets `nil, message`, as a failed sub-request does.
///
/// Threading: any thread; builds and drops its own Lua state.
public enum LuaScriptTest {
    /// What the run printed, and whether a hook failed (the command's exit status is then 1).
    public struct Report: Sendable {
        public var text: String
        public var failed: Bool
    }

    /// A file that could not be read or parsed, or a script that does not load.
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    public static func run(
        script scriptPath: String, request requestPath: String, response responsePath: String?, config configPath: String?,
        allowHosts allowed: [String] = [], http httpPaths: [String] = []
    )
        throws(Failure) -> Report
    {
        var allowHosts: [LuaAllowedHost] = []
        for text in allowed {
            switch LuaAllowedHost.parse(text) {
            case .success(let host): allowHosts.append(host)
            case .failure(let error): throw Failure(description: "sluice: --allow-host: \(error.message)")
            }
        }
        guard httpPaths.isEmpty || !allowHosts.isEmpty else {
            throw Failure(description: "sluice: --http answers sluice.http, which needs --allow-host (the entry's allow_hosts)")
        }
        let answers = try httpPaths.map { path throws(Failure) in (path, try parseResponse(try text(path), file: path)) }
        let source = try text(scriptPath)
        let script = LuaScript(name: FileContents.lastComponent(of: scriptPath), source: source)
        var request = try parseRequest(try text(requestPath), file: requestPath)
        // As in the proxy, `Host` is not among `req.headers` (it follows the URL): kept aside,
        // and printed first.
        let hostName = HTTPField.Name("Host")!
        let host = request.headers[fields: hostName]
        request.headers[fields: hostName] = []
        let response = try responsePath.map { path throws(Failure) in try parseResponse(try text(path), file: path) }
        let config = try configPath.map { path throws(Failure) in try readConfig(path) } ?? .empty

        var out = ""
        let state: LuaState
        do throws(LuaLoadError) {
            state = try LuaState.load(script, limits: .default) { line in
                out += "log \(line.level.rawValue) \(line.script):\(line.line): \(line.message)\n"
            }
        } catch {
            throw Failure(description: "sluice: \(error.message)")
        }
        if state.declaresEveryTry && !allowHosts.isEmpty {
            // As the configuration refuses it: a hook run inside a try cannot wait.
            throw Failure(
                description:
                    "sluice: \(script.name) returns every_try = true: sluice.http (--allow-host) is for a hook that runs once per exchange"
            )
        }
        let exchange = state.makeExchange(config: config, limits: .default, requestID: 1)
        var records: [LuaCallRecord] = []
        var failed = false
        func record(_ hook: String, _ result: LuaCallResult) {
            let record = LuaCallRecord(script: script.name, hook: hook, result: result, vars: exchange.vars())
            records.append(record)
            failed = failed || result.outcome != .ok
            out += "\(hook): \(record.outcome)"
            if let error = record.error { out += ": \(error)" }
            out += " (\(record.microseconds) us, \(record.instructions) instructions, \(record.memory) bytes)\n"
        }

        var answered: LuaResponseView?
        if state.hasOnRequest, !allowHosts.isEmpty {
            // A call that may wait: every answer is at hand, so it ends before `onRequest` returns.
            let host = FileAnswers(answers) { out += $0 }
            var ended: LuaCallResult?
            exchange.onRequest(request, waitingWith: host, allowHosts: allowHosts, depth: 0) { edited, result in
                request = edited
                ended = result
            }
            guard let result = ended else { throw Failure(description: "sluice: on_request did not end") }
            record("on_request", result)
            answered = result.respond
        } else if state.hasOnRequest {
            let result = exchange.onRequest(&request)
            record("on_request", result)
            answered = result.respond
        }
        // A failed `on_request` ends the exchange as the proxy ends it by default
        // (`on_error: fail_closed`): a 502, nothing sent upstream, no `on_response`; `on_log`
        // still runs.
        let refused = records.last.map { $0.hook == "on_request" && $0.outcome != "ok" } ?? false
        var origin = answered == nil && !refused ? response : nil
        if var edited = origin, state.hasOnResponse {
            let result = exchange.onResponse(&edited)
            record("on_response", result)
            if result.retry { out += "res:retry(): the retry policy would count this answer as a failed try\n" }
            origin = edited
        }
        if let given = response, let after = origin, after.status != 204, after.status != 304,
            isChunked(given.headers) || after.body != given.body
        {
            // A chunked body, or one the script replaced: re-framed as the proxy sends it.
            origin = reframed(after)
        }
        if state.hasOnLog { record("on_log", exchange.onLog()) }
        if refused {
            out +=
                "--- answered by Sluice: 502 (on_request failed; with on_error: fail_closed, the default, nothing is sent upstream and on_response does not run; with fail_open the request goes on without the script's edits)\n"
        } else if let answered {
            out += "--- answered by req:respond (nothing sent upstream)\n" + render(answered)
        } else {
            var printed = request
            printed.headers.insert(contentsOf: host, at: 0)
            out += "--- request\n" + render(printed)
        }
        if let origin { out += "--- response\n" + render(origin) }
        out += "--- log\n"
        for record in records { out += "lua: \(record.json)\n" }
        return Report(text: out, failed: failed)
    }

    /// The `LuaHost` of a test run: `sluice.http` answered by the `--http` files in order, each
    /// call printed (`print`) with the file that answered it. No timer is needed: an answer is
    /// given at once, so no call ever waits.
    private final class FileAnswers: LuaHost {
        private var answers: ArraySlice<(String, LuaResponseView)>
        private var made = 0
        private let print: (String) -> Void

        init(_ answers: [(String, LuaResponseView)], print: @escaping (String) -> Void) {
            self.answers = answers[...]
            self.print = print
        }

        private final class Done: LuaOperation {
            func cancel() {}
        }

        func subrequest(
            _ request: LuaSubrequest, completion: @escaping (Result<LuaSubresponse, LuaOperationError>) -> Void
        ) -> any LuaOperation {
            made += 1
            var text = "--- sluice.http #\(made)\n\(request.method) \(request.url)\n"
            text += request.headers.map { "\($0.0): \($0.1)\n" }.joined()
            if let body = request.body, !body.isEmpty { text += "\n" + Self.shown(body) }
            guard let (path, response) = answers.popFirst() else {
                print(text + "(no --http file left: the call gets nil, message)\n")
                completion(.failure(LuaOperationError("no --http file left for this sub-request")))
                return Done()
            }
            print(text + "(answered by \(path): \(response.status))\n")
            let body = response.body ?? []
            if body.count > request.maxBody {
                completion(.failure(LuaOperationError("the answer's body is over limits.body (\(request.maxBody))")))
            } else {
                let headers = response.headers.map { ($0.name.rawName, $0.value) }
                completion(.success(LuaSubresponse(status: response.status, headers: headers, body: body)))
            }
            return Done()
        }

        func timer(microseconds: Int64, _ fired: @escaping () -> Void) -> any LuaOperation { Done() }

        func refusal(host: String, port: Int) -> String? { nil }

        private static func shown(_ body: [UInt8]) -> String {
            guard let text = String(validating: body, as: UTF8.self) else { return "(\(body.count) bytes, not UTF-8)\n" }
            return text + (text.hasSuffix("\n") ? "" : "\n")
        }
    }

    private static func text(_ path: String) throws(Failure) -> String {
        guard let data = FileContents.bytes(atPath: path) else {
            throw Failure(description: "sluice: cannot read \(path)")
        }
        return String(decoding: data, as: UTF8.self)
    }

    /// `config:` of the `lua` entry, from a YAML (or JSON) map.
    static func readConfig(_ path: String) throws(Failure) -> LuaConfig {
        var reader = NodeReader(file: path)
        let root: YAMLNode?
        do {
            root = try YAMLReader.read(try text(path))
        } catch let error as YAMLError {
            throw Failure(description: reader.issue(for: error).description)
        } catch {
            throw Failure(description: "\(error)")
        }
        guard let root, case .mapping = root, case .table(let values)? = LuaKind.value(root, &reader), reader.issues.isEmpty
        else {
            throw Failure(
                description: reader.issues.first?.description ?? "\(path): the config must be a map (the lua entry's config)")
        }
        return LuaConfig(values)
    }

    /// The start line, the header fields and the body of a message file.
    static func parseMessage(_ text: String, file: String) throws(Failure) -> (start: String, headers: HTTPFields, body: [UInt8])
    {
        let bytes = Array(text.utf8)
        var lines: [String] = []
        var at = 0
        while at < bytes.count {
            let end = bytes[at...].firstIndex(of: 0x0A) ?? bytes.count
            var line = bytes[at..<end]
            if line.last == 0x0D { line = line.dropLast() }
            at = end + 1
            if line.isEmpty {
                if lines.isEmpty { continue }  // blank lines before the start line
                break
            }
            lines.append(String(decoding: line, as: UTF8.self))
        }
        guard let start = lines.first else { throw Failure(description: "\(file): empty message") }
        var headers = HTTPFields()
        for (n, line) in lines.dropFirst().enumerated() {
            guard let colon = line.firstIndex(of: ":"), let name = HTTPField.Name(String(line[..<colon])) else {
                throw Failure(description: "\(file):\(n + 2): not a header line: \(line)")
            }
            headers.append(HTTPField(name: name, value: String(line[line.index(after: colon)...]).trimmingWhitespace()))
        }
        return (start, headers, at < bytes.count ? Array(bytes[at...]) : [])
    }

    /// `METHOD TARGET HTTP/1.1`, the target in origin form (`/path?query`) or absolute form.
    static func parseRequest(_ text: String, file: String) throws(Failure) -> LuaRequestView {
        let (start, headers, body) = try parseMessage(text, file: file)
        let parts = start.split(separator: " ")
        guard parts.count == 3, parts[2].hasPrefix("HTTP/") else {
            throw Failure(description: "\(file):1: not a request line (METHOD TARGET HTTP/1.1): \(start)")
        }
        let target = LuaAdapter.Target(String(parts[1]))
        return LuaRequestView(
            method: String(parts[0]), path: target.path.isEmpty ? "/" : target.path, query: target.query, headers: headers,
            body: body)
    }

    /// `HTTP/1.1 STATUS REASON`. A chunked body (a `Transfer-Encoding` whose last coding is
    /// `chunked`) is decoded, as the proxy gives it to `res:body()` and to `sluice.http`.
    static func parseResponse(_ text: String, file: String) throws(Failure) -> LuaResponseView {
        let (start, headers, body) = try parseMessage(text, file: file)
        let parts = start.split(separator: " ", maxSplits: 2)
        guard parts.count >= 2, parts[0].hasPrefix("HTTP/"), let status = Int(parts[1]), (100...999).contains(status) else {
            throw Failure(description: "\(file):1: not a status line (HTTP/1.1 STATUS REASON): \(start)")
        }
        let decoded = isChunked(headers) ? try dechunked(body, file: file) : body
        return LuaResponseView(status: status, headers: headers, body: decoded)
    }

    static func isChunked(_ headers: HTTPFields) -> Bool {
        let codings = headers[values: .transferEncoding].flatMap { $0.split(separator: ",") }
        return codings.last.map { $0.trimmingWhitespace().lowercased() == "chunked" } ?? false
    }

    /// The data of a chunked body: sizes in hex (extensions after `;` ignored), up to the last
    /// chunk; trailer fields are dropped, as the proxy drops them.
    static func dechunked(_ body: [UInt8], file: String) throws(Failure) -> [UInt8] {
        var out: [UInt8] = []
        var at = 0
        while true {
            guard let lf = body[at...].firstIndex(of: 0x0A) else {
                throw Failure(description: "\(file): chunked body without its last chunk")
            }
            let line = String(decoding: body[at..<lf], as: UTF8.self)
            let digits = line.split(separator: ";", maxSplits: 1).first.map { $0.trimmingWhitespace() } ?? ""
            guard !digits.isEmpty, digits.count <= 15, digits.allSatisfy(\.isHexDigit), let size = Int(digits, radix: 16) else {
                throw Failure(description: "\(file): bad chunk size line: \(line)")
            }
            at = lf + 1
            if size == 0 { return out }
            guard at + size <= body.count else { throw Failure(description: "\(file): chunk shorter than its size \(digits)") }
            out += body[at..<at + size]
            at += size
            // The chunk's CRLF (or LF).
            if at < body.count, body[at] == 0x0D { at += 1 }
            guard at < body.count, body[at] == 0x0A else {
                throw Failure(description: "\(file): chunk of size \(digits) not followed by a line end")
            }
            at += 1
        }
    }

    /// The response as the client gets a kept body: framed by `Content-Length`, its
    /// `Transfer-Encoding` and old `Content-Length` left out (`ResponseEncoder.keptBodyAnswer`).
    static func reframed(_ response: LuaResponseView) -> LuaResponseView {
        var out = response
        out.headers[fields: .transferEncoding] = []
        out.headers[fields: .contentLength] = []
        out.headers.append(HTTPField(name: .contentLength, value: String(response.body?.count ?? 0)))
        return out
    }

    static func render(_ request: LuaRequestView) -> String {
        "\(request.method) \(request.path)\(request.query.map { "?" + $0 } ?? "") HTTP/1.1\n"
            + render(request.headers, request.body)
    }

    static func render(_ response: LuaResponseView) -> String {
        "HTTP/1.1 \(response.status)\n" + render(response.headers, response.body)
    }

    /// Header lines, an empty line, and the body: as text when it is UTF-8, else its size.
    private static func render(_ headers: HTTPFields, _ body: [UInt8]?) -> String {
        var out = headers.map { "\($0.name.rawName): \($0.value)\n" }.joined() + "\n"
        if let body, !body.isEmpty {
            if let text = String(validating: body, as: UTF8.self) {
                out += text + (text.hasSuffix("\n") ? "" : "\n")
            } else {
                out += "(\(body.count) bytes, not UTF-8)\n"
            }
        }
        return out
    }
}

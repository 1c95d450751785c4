import CZlib
import HTTPTypes
import SluiceCore
import Testing

func request(
    _ url: String = "http://api.test/x", method: String = "GET", body: ProxyRequest.Body = .none,
    fields: HTTPFields = [:]
) -> ProxyRequest {
    ProxyRequest(id: 1, method: method, url: url, headerFields: fields, body: body)
}

/// Runs an adapter that answers synchronously.
func adapt(_ adapter: any RequestAdapter, _ r: ProxyRequest) -> Result<ProxyRequest, AdaptationError> {
    var out: Result<ProxyRequest, AdaptationError>?
    adapter.adapt(r) { out = $0 }
    return out!
}

struct RecordingAdapter: RequestAdapter {
    let name: String
    let fail: Bool
    func adapt(_ request: ProxyRequest, completion: @escaping (Result<ProxyRequest, AdaptationError>) -> Void) {
        if fail { return completion(.failure(AdaptationError(adapter: name, reason: "refused"))) }
        var r = request
        r.headerFields.append(HTTPField(name: HTTPField.Name("X-Trace")!, value: name))
        completion(.success(r))
    }
}

struct FixedRetrier: RequestRetrier {
    let name: String
    let answer: RetryResult
    func retry(_ request: ProxyRequest, dueTo failure: TryFailure, attempt: Int, completion: @escaping (RetryResult) -> Void) {
        completion(answer)
    }
}

@Suite struct InterceptorTests {
    @Test func adaptersRunInOrderAndStopAtFirstFailure() throws {
        let ok = Interceptor(adapters: [RecordingAdapter(name: "a", fail: false), RecordingAdapter(name: "b", fail: false)])
        let adapted = try adapt(ok, request()).get()
        #expect(adapted.headerFields[values: HTTPField.Name("X-Trace")!] == ["a", "b"])

        let failing = Interceptor(adapters: [
            RecordingAdapter(name: "a", fail: false), RecordingAdapter(name: "b", fail: true),
            RecordingAdapter(name: "c", fail: false),
        ])
        #expect(adapt(failing, request()) == .failure(AdaptationError(adapter: "b", reason: "refused")))
    }

    @Test func retriersAreAskedUntilOneAnswersOtherThanDoNotRetry() {
        let interceptor = Interceptor(retriers: [
            FixedRetrier(name: "1", answer: .doNotRetry),
            FixedRetrier(name: "2", answer: .retryWithDelay(milliseconds: 500)),
            FixedRetrier(name: "3", answer: .retry),
        ])
        var answer: RetryResult?
        interceptor.retry(request(), dueTo: .transport(.refused, .upstreamRefused(host: "h")), attempt: 1) { answer = $0 }
        #expect(answer == .retryWithDelay(milliseconds: 500))
        var none: RetryResult?
        Interceptor(retriers: [FixedRetrier(name: "1", answer: .doNotRetry)])
            .retry(request(), dueTo: .transport(.refused, .upstreamRefused(host: "h")), attempt: 1) { none = $0 }
        #expect(none == .doNotRetry)
    }
}

@Suite struct AdapterTests {
    @Test func headersRemoveThenSetThenAdd() throws {
        let x = HTTPField.Name("X-A")!
        let adapter = HeaderAdapter(set: [(x, "set")], add: [(x, "added")], remove: [.userAgent])
        let r = try adapt(adapter, request(fields: [.userAgent: "curl", x: "client"])).get()
        #expect(r.headerFields[.userAgent] == nil)
        #expect(r.headerFields[values: x] == ["set", "added"])
    }

    @Test func authenticationAdapters() throws {
        let bearer = try adapt(BearerAdapter(token: Secret("t0k")), request(fields: [.authorization: "old"])).get()
        #expect(bearer.headerFields[values: .authorization] == ["Bearer t0k"])
        let basic = try adapt(BasicAuthAdapter(username: "Aladdin", password: Secret("open sesame")), request()).get()
        #expect(basic.headerFields[.authorization] == "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==")  // RFC 7617 §2
        let header = try adapt(APIKeyAdapter(placement: .header("X-Api-Key"), value: Secret("k")), request()).get()
        #expect(header.headerFields[HTTPField.Name("X-Api-Key")!] == "k")
        let query = try adapt(
            APIKeyAdapter(placement: .query("key"), value: Secret("a b&c")),
            request("http://h/p?key=old&x=1#frag")
        ).get()
        #expect(query.url == "http://h/p?x=1&key=a%20b%26c#frag")
        #expect(
            try adapt(APIKeyAdapter(placement: .query("key"), value: Secret("v")), request("http://h")).get().url
                == "http://h?key=v")
    }

    @Test func deflateRoundTripsAndHonoursThresholdAndDuplicates() throws {
        let compressor = DeflateRequestCompressor(minBytes: 100)
        #expect(try adapt(compressor, request(method: "POST", body: .length(99))).get().bodyEncoders.isEmpty)
        let adapted = try adapt(compressor, request(method: "POST", body: .length(100))).get()
        #expect(adapted.headerFields[.contentEncoding] == "deflate")
        #expect(adapted.body == .streamed)

        // Stream 3 MiB of compressible data through the encoder in odd-sized pieces.
        var original: [UInt8] = []
        for i in 0..<(3 << 20) { original.append(UInt8((i / 7) % 251)) }
        let encoder = adapted.bodyEncoders[0].makeEncoder()
        var compressed: [UInt8] = []
        var offset = 0
        let pieces = [1, 4095, 65_537, 1 << 20]
        var k = 0
        while offset < original.count {
            let n = min(pieces[k % pieces.count], original.count - offset)
            try original[offset..<(offset + n)].withUnsafeBytes { try encoder.encode($0, finish: false, into: &compressed) }
            offset += n
            k += 1
        }
        try encoder.encode(UnsafeRawBufferPointer(start: nil, count: 0), finish: true, into: &compressed)
        #expect(compressed.count < original.count / 10)
        #expect(compressed[0] == 0x78)  // a zlib header, not raw deflate
        #expect(try inflate(compressed) == original)

        let withEncoding = request(method: "POST", body: .streamed, fields: [.contentEncoding: "gzip"])
        #expect(
            adapt(DeflateRequestCompressor(), withEncoding)
                == .failure(
                    AdaptationError(
                        adapter: "deflate", reason: "the request already has a Content-Encoding header")))
        #expect(try adapt(DeflateRequestCompressor(duplicateHeaderBehavior: .skip), withEncoding).get().bodyEncoders.isEmpty)
        let replaced = try adapt(DeflateRequestCompressor(duplicateHeaderBehavior: .replace), withEncoding).get()
        #expect(replaced.headerFields[values: .contentEncoding] == ["deflate"])
        #expect(replaced.bodyEncoders.count == 1)
    }

    func inflate(_ data: [UInt8]) throws -> [UInt8] {
        var stream = z_stream()
        #expect(inflateInit_(&stream, ZLIB_VERSION, Int32(MemoryLayout<z_stream>.size)) == Z_OK)
        defer { inflateEnd(&stream) }
        var out: [UInt8] = []
        var input = data
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        var rc: Int32 = Z_OK
        input.withUnsafeMutableBufferPointer { inBuf in
            stream.next_in = inBuf.baseAddress
            stream.avail_in = UInt32(inBuf.count)
            repeat {
                buffer.withUnsafeMutableBufferPointer { outBuf in
                    stream.next_out = outBuf.baseAddress
                    stream.avail_out = UInt32(outBuf.count)
                    rc = CZlib.inflate(&stream, Z_NO_FLUSH)
                }
                out.append(contentsOf: buffer[0..<(buffer.count - Int(stream.avail_out))])
            } while rc == Z_OK
        }
        #expect(rc == Z_STREAM_END)
        return out
    }
}

@Suite struct RedirectorTests {
    @Test func doNotFollowIsTheDefault() {
        #expect(Redirector.doNotFollow.redirect(request(), status: 302, location: "http://api.test/y", hops: 0) == nil)
    }

    @Test func followRules() throws {
        let follow = Redirector(behavior: .follow(max: 2))
        let post = request(
            method: "POST", body: .length(3), fields: [.authorization: "a", .cookie: "c", .contentType: "text/plain"])
        let sameHost = try #require(follow.redirect(post, status: 307, location: "http://api.test/z", hops: 0))
        #expect(sameHost.method == "POST" && sameHost.body == .length(3))
        #expect(sameHost.headerFields[.authorization] == "a")
        let seeOther = try #require(follow.redirect(post, status: 303, location: "http://other.test/z", hops: 1))
        #expect(seeOther.method == "GET" && seeOther.body == .none)
        #expect(seeOther.headerFields[.authorization] == nil && seeOther.headerFields[.cookie] == nil)
        #expect(seeOther.headerFields[.contentType] == nil)
        #expect(follow.redirect(post, status: 302, location: "http://api.test/z", hops: 2) == nil)  // max reached
        #expect(follow.redirect(post, status: 302, location: "ftp://api.test/z", hops: 0) == nil)
        #expect(follow.redirect(post, status: 304, location: "http://api.test/z", hops: 0) == nil)
    }

    @Test func modifyRewritesTheLocation() throws {
        let modify = Redirector(behavior: .modify(max: 3, rewrites: [.init(from: "http://", to: "https://")]))
        let next = try #require(modify.redirect(request(), status: 301, location: "http://api.test/secure", hops: 0))
        #expect(next.url == "https://api.test/secure")
    }

    @Test func resolvesLocationReferences() {
        let base = "http://h:8080/a/b/c?q=1"
        #expect(Redirector.resolve("https://x/y", against: base) == "https://x/y")
        #expect(Redirector.resolve("//x/y", against: base) == "http://x/y")
        #expect(Redirector.resolve("/root", against: base) == "http://h:8080/root")
        #expect(Redirector.resolve("sib", against: base) == "http://h:8080/a/b/sib")
        #expect(Redirector.resolve("?z=2", against: base) == "http://h:8080/a/b/c?z=2")
    }
}

extension ProxyRequest: Equatable {
    public static func == (a: ProxyRequest, b: ProxyRequest) -> Bool {
        a.method == b.method && a.url == b.url && a.headerFields == b.headerFields && a.body == b.body
    }
}

@Suite struct PolicyTableTests {
    @Test func exactBeatsWildcardAndLongestSuffixWins() {
        let table = PolicyTable(entries: [
            PolicyEntry(name: "default", adapters: [RecordingAdapter(name: "d", fail: false)], redirect: .doNotFollow),
            PolicyEntry(name: "*.corp.internal", adapters: [RecordingAdapter(name: "corp", fail: false)], redirect: .follow),
            PolicyEntry(name: "*.eu.corp.internal", adapters: [RecordingAdapter(name: "eu", fail: false)]),
            PolicyEntry(name: "api.eu.corp.internal", adapters: [RecordingAdapter(name: "api", fail: false)]),
        ])
        #expect(table.match(host: "API.eu.corp.internal").name == "api.eu.corp.internal")
        #expect(table.match(host: "db.eu.corp.internal").name == "*.eu.corp.internal")
        #expect(table.match(host: "x.corp.internal").name == "*.corp.internal")
        #expect(table.match(host: "corp.internal").name == "default")
        #expect(table.match(host: "example.com").name == "default")
        // Adapters: the default's first, then the host's; sections the host does not name are inherited.
        let eu = table.match(host: "db.eu.corp.internal")
        #expect(eu.adapters.map(\.adapter.name) == ["d", "eu"])
        #expect(eu.adapters.map(\.entry) == ["default", "*.eu.corp.internal"])
        #expect(eu.redirector == .doNotFollow)
        #expect(table.match(host: "x.corp.internal").redirector == .follow)
    }
}

@Suite struct RetryPolicyTests {
    @Test func alamofireDefaultsAndBackoff() {
        let p = RetryPolicy()
        #expect(p.limit == 2 && p.base == 2 && p.scale == 500)
        #expect(p.methods == ["DELETE", "GET", "HEAD", "OPTIONS", "PUT", "TRACE"])
        #expect(p.statuses == [408, 500, 502, 503, 504])
        #expect([0, 1, 2].map(p.backoff) == [500, 1000, 2000])
        #expect(RetryPolicy(maxDelay: 1500).backoff(attempt: 5) == 1500)
    }

    /// The transports' switch and the set the policies start from agree: every method in the
    /// set, and none of the others (methods are case-sensitive).
    @Test func defaultRetryableSwitchMatchesTheSet() {
        for method in RetryPolicy.defaultRetryableMethods { #expect(RetryPolicy.isDefaultRetryable(method)) }
        for method in ["POST", "PATCH", "CONNECT", "get", "Head", "GETX", "", "PROPFIND"] {
            #expect(!RetryPolicy.isDefaultRetryable(method), "\(method)")
            #expect(!RetryPolicy.defaultRetryableMethods.contains(method))
        }
    }

    @Test func decisions() {
        let p = RetryPolicy(limit: 2, scale: 100)
        func ask(
            _ method: String, _ failure: TryFailure, _ attempt: Int, _ policy: RetryPolicy = RetryPolicy(limit: 2, scale: 100)
        ) -> RetryResult? {
            var out: RetryResult?
            policy.retry(request(method: method), dueTo: failure, attempt: attempt) { out = $0 }
            return out
        }
        #expect(ask("GET", .status(503, retryAfterMilliseconds: nil), 0) == .retryWithDelay(milliseconds: 100))
        #expect(ask("GET", .status(503, retryAfterMilliseconds: nil), 1) == .retryWithDelay(milliseconds: 200))
        #expect(ask("GET", .status(503, retryAfterMilliseconds: nil), 2) == .doNotRetryWithError(.limit))
        #expect(ask("POST", .status(503, retryAfterMilliseconds: nil), 0) == .doNotRetryWithError(.method))
        #expect(ask("GET", .status(404, retryAfterMilliseconds: nil), 0) == .doNotRetry)
        #expect(ask("GET", .transport(.refused, .upstreamRefused(host: "h")), 0) == .retryWithDelay(milliseconds: 100))
        #expect(ask("GET", .transport(.other, .upstreamRefused(host: "h")), 0) == .doNotRetry)
        // Retry-After on 503 and 429 wins over the backoff, capped by max_delay.
        #expect(ask("GET", .status(503, retryAfterMilliseconds: 2000), 0) == .retryWithDelay(milliseconds: 2000))
        let capped = RetryPolicy(maxDelay: 1000, statuses: [429])
        #expect(ask("GET", .status(429, retryAfterMilliseconds: 5000), 0, capped) == .retryWithDelay(milliseconds: 1000))
        _ = p
    }

    @Test func jitterBounds() {
        for _ in 0..<200 {
            var full: RetryResult?
            var equal: RetryResult?
            RetryPolicy(scale: 1000, jitter: .full).retry(request(), dueTo: .status(503, retryAfterMilliseconds: nil), attempt: 0)
            { full = $0 }
            RetryPolicy(scale: 1000, jitter: .equal).retry(
                request(), dueTo: .status(503, retryAfterMilliseconds: nil), attempt: 0
            ) { equal = $0 }
            guard case .retryWithDelay(let f)? = full, case .retryWithDelay(let e)? = equal else {
                Issue.record("no delay")
                return
            }
            #expect((0...1000).contains(f))
            #expect((500...1000).contains(e))
        }
    }

    @Test func budgetAllowsMaxOfRatioAndMinimum() {
        let budget = RetryBudget(limits: .init(ratio: 0.2, minPerSecond: 3))
        for _ in 0..<10 { budget.recordRequest() }
        var granted = 0
        for _ in 0..<10 where budget.tryAcquireRetry() { granted += 1 }
        // max(3, 0.2 × 10) = 3, unless the second rolled over mid-test (then up to 6).
        #expect(granted >= 3 && granted <= 6)
    }

    @Test func validation() {
        let v = ResponseValidator(statuses: [200...299, 304...304], contentTypes: ["application/json", "text/*"])
        #expect(v.validate(status: 200, contentType: "application/json; charset=utf-8") == nil)
        #expect(v.validate(status: 200, contentType: "text/html") == nil)
        #expect(v.validate(status: 404, contentType: "application/json") == "status 404 is not acceptable")
        #expect(v.validate(status: 200, contentType: "image/png") == "content type image/png is not acceptable")
        #expect(v.validate(status: 200, contentType: nil) != nil)
    }
}

@Suite struct TrustPrimitiveTests {
    @Test func base64RoundTripsAndRejectsJunk() {
        for n in 0..<40 {
            let bytes = (0..<n).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }
            #expect(Base64.decode(Base64.encode(bytes)) == bytes)
        }
        #expect(Base64.decode("ab$c") == nil)
        #expect(Base64.decode("QQ==QQ==") == nil)
    }

    @Test func pinsAreSha256OfThirtyTwoBytes() {
        let digest = [UInt8](repeating: 0xAB, count: 32)
        #expect(CertificateFiles.parsePin("sha256/" + Base64.encode(digest)) == digest)
        #expect(CertificateFiles.parsePin("sha256//" + Base64.encode(digest)) == digest)
        #expect(CertificateFiles.parsePin("sha1/" + Base64.encode(digest)) == nil)
        #expect(CertificateFiles.parsePin("sha256/" + Base64.encode(Array(digest.prefix(20)))) == nil)
    }

    @Test func requirementsAddUp() {
        let pinned = PinnedCertificatesTrustEvaluator(certificates: [[1, 2, 3]], validateChain: false, validateHost: false)
        let combined = CompositeTrustEvaluator(evaluators: [pinned, RevocationTrustEvaluator(crls: [[9]])]).requirements
        #expect(combined.validateChain && combined.validateHost)
        #expect(combined.certificatePins == [[[1, 2, 3]]])
        #expect(combined.crls == [[9]])
        #expect(!combined.insecure)
        #expect(DisabledTrustEvaluator().requirements.insecure)
        #expect(DefaultTrustEvaluator().requirements.isCurlNative)
        #expect(!pinned.requirements.isCurlNative)
    }
}

@Suite struct HeaderEditPlanTests {
    /// The plan (drop replaced names, append the rest) gives the same fields, name by name,
    /// as running the adapters on `HTTPFields`.
    @Test func planMatchesApplyingTheAdapters() throws {
        let adapters: [any RequestAdapter] = [
            HeaderAdapter(
                set: [(HTTPField.Name("X-A")!, "1")], add: [(HTTPField.Name("X-B")!, "2")],
                remove: [HTTPField.Name("X-Debug")!]),
            BearerAdapter(token: Secret("tok")),
            HeaderAdapter(add: [(HTTPField.Name("X-A")!, "3"), (HTTPField.Name("Accept")!, "x/y")]),
            APIKeyAdapter(placement: .header("X-Key"), value: Secret("k\r\nInjected: 1")),
        ]
        var client = HTTPFields()
        client.append(HTTPField(name: HTTPField.Name("X-Debug")!, value: "on"))
        client.append(HTTPField(name: .authorization, value: "Basic old"))
        client.append(HTTPField(name: HTTPField.Name("X-B")!, value: "client"))
        client.append(HTTPField(name: HTTPField.Name("x-a")!, value: "client"))
        var model = ProxyRequest(id: 1, method: "GET", url: "http://h/", headerFields: client, body: .none)
        for adapter in adapters { _ = try adapter.adaptInPlace(&model) }

        let plan = try #require(HeaderEditPlan.of(adapters))
        var planned: [(String, String)] = []
        for field in client {
            let name = Array(field.name.canonicalName.utf8)
            if name.withUnsafeBufferPointer({ plan.replaces($0) }) { continue }
            planned.append((field.name.canonicalName, field.value))
        }
        planned += plan.appended.map { ($0.name.lowercased(), $0.value) }

        func grouped(_ fields: [(String, String)]) -> [String: [String]] {
            Dictionary(grouping: fields, by: \.0).mapValues { $0.map(\.1) }
        }
        let adapted = model.headerFields.map { ($0.name.canonicalName, $0.value) }
        #expect(grouped(planned) == grouped(adapted))
        #expect(grouped(planned)["x-key"] == ["k  Injected: 1"])
        #expect(grouped(planned)["x-debug"] == nil)
        #expect(grouped(planned)["authorization"] == ["Bearer tok"])
        // The bytes the forwarded lines copy say what `appended` says, field for field.
        let fromBytes = plan.appendedRanges.map {
            (
                String(decoding: plan.appendedBytes[$0.name], as: UTF8.self),
                String(decoding: plan.appendedBytes[$0.value], as: UTF8.self)
            )
        }
        #expect(fromBytes.map(\.0) == plan.appended.map(\.name))
        #expect(fromBytes.map(\.1) == plan.appended.map(\.value))
    }

    @Test func queryKeysAndOtherAdaptersHaveNoPlan() {
        #expect(HeaderEditPlan.of([APIKeyAdapter(placement: .query("k"), value: Secret("v"))]) == nil)
        #expect(HeaderEditPlan.of([DeflateRequestCompressor()]) == nil)
        #expect(HeaderEditPlan.of([BearerAdapter(token: Secret("t"))]) != nil)
    }
}

import Foundation
import SluiceCore
import Testing

@testable import SluiceConfig

/// `aws_sigv4` against the AWS Signature Version 4 test suite (aws-c-auth's
/// `tests/aws-signing-test-suite/v4`, Apache-2.0, in `Vectors/aws-sigv4` with its license):
/// for every case, the canonical request, the string to sign and the signature, byte for byte.
@Suite struct AWSSigV4Tests {
    static let vectors = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("Vectors/aws-sigv4")

    static var cases: [String] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: vectors.path)) ?? []
        return names.filter {
            FileManager.default.fileExists(atPath: vectors.appendingPathComponent("\($0)/context.json").path)
        }.sorted()
    }

    struct Case {
        var method = ""
        var path = ""
        var query = ""
        var headers: [(String, String)] = []
        var body: [UInt8] = []
        var context: [String: Any] = [:]
    }

    /// `request.txt`: the request line with its raw target, `Name:value` lines (a line that
    /// starts with white space continues the previous value), a blank line, then the body.
    static func load(_ name: String) throws -> Case {
        let folder = vectors.appendingPathComponent(name)
        let data = try Data(contentsOf: folder.appendingPathComponent("context.json"))
        var c = Case()
        c.context = try JSONSerialization.jsonObject(with: data) as! [String: Any]
        let text = try String(contentsOf: folder.appendingPathComponent("request.txt"), encoding: .utf8)
        var lines = text.components(separatedBy: "\n")
        let requestLine = lines.removeFirst()
        let firstSpace = requestLine.firstIndex(of: " ")!
        c.method = String(requestLine[..<firstSpace])
        var target = String(requestLine[requestLine.index(after: firstSpace)...])
        target = String(target.dropLast(" HTTP/1.1".count))
        if let q = target.firstIndex(of: "?") {
            c.path = String(target[..<q])
            c.query = String(target[target.index(after: q)...])
        } else {
            c.path = target
        }
        while let line = lines.first {
            lines.removeFirst()
            if line.isEmpty { break }
            if line.first == " " || line.first == "\t", !c.headers.isEmpty {
                c.headers[c.headers.count - 1].1 += " " + line
                continue
            }
            let colon = line.firstIndex(of: ":")!
            c.headers.append((line[..<colon].lowercased(), String(line[line.index(after: colon)...])))
        }
        c.body = Array(lines.joined(separator: "\n").utf8)
        return c
    }

    static func expected(_ name: String, _ file: String) throws -> String {
        try String(contentsOf: vectors.appendingPathComponent("\(name)/\(file)"), encoding: .utf8)
    }

    @Test func theSuiteIsHere() {
        #expect(Self.cases.count >= 38, "Vectors/aws-sigv4 holds the v4 suite")
    }

    @Test(arguments: AWSSigV4Tests.cases)
    func everyCaseOfTheSuite(_ name: String) throws {
        var c = try Self.load(name)
        let credentials = c.context["credentials"] as! [String: String]
        let signBody = c.context["sign_body"] as? Bool ?? false
        let normalize = c.context["normalize"] as? Bool ?? true
        let omitToken = c.context["omit_session_token"] as? Bool ?? false
        let timestamp = AWSSignatureV4.timestamp(wallClockMilliseconds: 1_440_938_160_000)  // 2015-08-30T12:36:00Z
        #expect(timestamp == "20150830T123600Z")
        c.headers.append(("x-amz-date", timestamp))
        if let token = credentials["token"], !omitToken { c.headers.append(("x-amz-security-token", token)) }
        let payloadHash = Hex.lowercase(Crypto.sha256(signBody ? c.body : []))
        if signBody { c.headers.append(("x-amz-content-sha256", payloadHash)) }
        let signer = AWSSignatureV4(
            accessKeyID: credentials["access_key_id"]!, secret: credentials["secret_access_key"]!,
            region: c.context["region"] as! String, service: c.context["service"] as! String)
        let signed = signer.sign(
            method: c.method, path: Substring(c.path), query: Substring(c.query), headers: c.headers,
            payloadHash: payloadHash, timestamp: timestamp, normalizePath: normalize, encodePath: true)
        #expect(signed.canonicalRequest == (try Self.expected(name, "header-canonical-request.txt")))
        #expect(signed.stringToSign == (try Self.expected(name, "header-string-to-sign.txt")))
        #expect(signed.signature == (try Self.expected(name, "header-signature.txt")))
    }

    /// The adapter on a request as Sluice forwards it: `Host` from the URL (no default port),
    /// the date of the try, the body's hash, and a client's `Authorization` replaced.
    @Test func theAdapterSignsWhatIsSent() throws {
        let signer = AWSSigV4Signer(
            service: "s3", region: "eu-west-1",
            credentials: .fixed(
                AWSCredentials(accessKeyID: "AKIDEXAMPLE", secret: Secret("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"))),
            payload: .signed, excludedHeaders: AWSSigV4Signer.defaultExcludedHeaders)
        var request = ProxyRequest(
            id: 1, method: "PUT", url: "http://bucket.example.com:80/a%20b?z=1&a=2", headerFields: [:], body: .length(5))
        request.headerFields[.authorization] = "Basic Zm9vOmJhcg=="
        request.headerFields[.init("X-Forwarded-For")!] = "10.0.0.1"
        try signer.adaptTry(&request, TryContext(body: Array("hello".utf8), wallClockMilliseconds: 1_440_938_160_000, attempt: 1))
        let authorization = request.headerFields[.authorization] ?? ""
        #expect(authorization.hasPrefix("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/eu-west-1/s3/aws4_request, "))
        #expect(authorization.contains("SignedHeaders=host;x-amz-content-sha256;x-amz-date,"))
        #expect(request.headerFields[.init("x-amz-content-sha256")!] == Hex.lowercase(Crypto.sha256(Array("hello".utf8))))
        #expect(request.headerFields[.init("x-amz-date")!] == "20150830T123600Z")
        let again = AWSSignatureV4(
            accessKeyID: "AKIDEXAMPLE", secret: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", region: "eu-west-1", service: "s3"
        ).sign(
            method: "PUT", path: "/a%20b", query: "z=1&a=2",
            headers: [
                ("host", "bucket.example.com"),
                ("x-amz-content-sha256", Hex.lowercase(Crypto.sha256(Array("hello".utf8)))),
                ("x-amz-date", "20150830T123600Z"),
            ], payloadHash: Hex.lowercase(Crypto.sha256(Array("hello".utf8))), timestamp: "20150830T123600Z",
            normalizePath: false, encodePath: false)
        #expect(authorization == again.authorization)
        #expect(again.canonicalRequest.hasPrefix("PUT\n/a%20b\na=2&z=1\n"))
    }

    @Test func aQueryIsSortedAndEncodedOnce() {
        #expect(AWSSignatureV4.canonicalQuery("b=2&a=%c3%a9&a=1&c&*=x") == "%2A=x&a=%C3%A9&a=1&b=2&c=")
    }

    @Test func aCredentialsFileIsReadAgainWhenItChanges() throws {
        let path = NSTemporaryDirectory() + "sluice-aws-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { unlink(path) }
        try
            "[default]\naws_access_key_id = A1\naws_secret_access_key = S1\n[other]\naws_access_key_id=B\naws_secret_access_key=T\n"
            .write(toFile: path, atomically: true, encoding: .utf8)
        let file = AWSCredentialsFile(path: path, profile: "other")
        #expect((try? file.current().get())?.accessKeyID == "B")
        try "[other]\naws_access_key_id = B2\naws_secret_access_key = T2\naws_session_token = X\n"
            .write(toFile: path, atomically: true, encoding: .utf8)
        usleep(1_100_000)
        let next = try file.current().get()
        #expect(next.accessKeyID == "B2")
        #expect(next.sessionToken?.value == "X")
    }
}

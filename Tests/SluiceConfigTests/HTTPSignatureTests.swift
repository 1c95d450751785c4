import Foundation
import HTTPTypes
import SluiceCore
import Testing

@testable import SluiceConfig

/// `http_signature` against RFC 9421's Appendix B (in `Vectors/rfc9421`): the test request of
/// B.2 signed as B.2.5 (HMAC-SHA256, `test-shared-secret`) and B.2.6 (Ed25519,
/// `test-key-ed25519`) gives the RFC's signature base, `Signature-Input` and `Signature` byte
/// for byte (Ed25519 signatures are deterministic).
@Suite struct HTTPSignatureTests {
    static let vectors = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("Vectors/rfc9421")

    static func file(_ name: String) throws -> String {
        try String(contentsOf: vectors.appendingPathComponent(name), encoding: .utf8)
    }

    /// B.2's request as Sluice's adapters see it.
    static func request() throws -> (ProxyRequest, [UInt8]) {
        let text = try file("request.txt")
        let parts = text.components(separatedBy: "\n\n")
        var lines = parts[0].components(separatedBy: "\n")
        let requestLine = lines.removeFirst().split(separator: " ")
        var fields = HTTPFields()
        var host = ""
        for line in lines {
            let colon = line.firstIndex(of: ":")!
            let name = String(line[..<colon])
            let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
            if name.lowercased() == "host" {
                host = value
            } else {
                fields.append(HTTPField(name: HTTPField.Name(name)!, value: value))
            }
        }
        let body = Array(parts.dropFirst().joined(separator: "\n\n").utf8)
        let request = ProxyRequest(
            id: 1, method: String(requestLine[0]), url: "https://\(host)\(requestLine[1])", headerFields: fields,
            body: .length(Int64(body.count)))
        return (request, body)
    }

    static func signer(
        _ algorithm: HTTPMessageSigner.Algorithm, components: [String], label: String
    ) throws
        -> HTTPMessageSigner
    {
        let key: HTTPMessageSigner.Key
        let keyID: String
        switch algorithm {
        case .hmacSHA256:
            key = .hmac(
                Crypto.HMACKey(Base64.decode(try file("test-shared-secret.b64").trimmingCharacters(in: .whitespacesAndNewlines))!)
            )
            keyID = "test-shared-secret"
        case .ed25519:
            key = .ed25519(Crypto.Ed25519Key(pem: try file("test-key-ed25519.pem"))!)
            keyID = "test-key-ed25519"
        }
        return HTTPMessageSigner(
            keyID: keyID, algorithm: algorithm, key: key, keySource: "test", components: components, created: true,
            expiresAfter: nil, nonce: false, label: label, tag: nil)
    }

    /// 2021-04-20T02:07:53Z, the RFC's `created`.
    static let created = 1_618_884_473_000

    @Test(arguments: [
        ("b.2.5", HTTPMessageSigner.Algorithm.hmacSHA256, ["date", "@authority", "content-type"], "sig-b25"),
        (
            "b.2.6", .ed25519, ["date", "@method", "@path", "@authority", "content-type", "content-length"],
            "sig-b26"
        ),
    ])
    func appendixB(
        _ vector: String, _ algorithm: HTTPMessageSigner.Algorithm, _ components: [String], _ label: String
    )
        throws
    {
        var (request, body) = try Self.request()
        let signer = try Self.signer(algorithm, components: components, label: label)
        var parameters = HTTPMessageSignature.Parameters(keyID: signer.keyID)
        parameters.created = Self.created / 1000
        let base = HTTPMessageSignature.base(of: request, covering: components, parameters: parameters)
        #expect(base.base == (try Self.file("\(vector)-signature-base.txt")))
        try signer.adaptTry(&request, TryContext(body: body, wallClockMilliseconds: Self.created, attempt: 1))
        #expect(request.headerFields[HTTPField.Name("Signature-Input")!] == (try Self.file("\(vector)-signature-input.txt")))
        #expect(request.headerFields[HTTPField.Name("Signature")!] == (try Self.file("\(vector)-signature.txt")))
    }

    /// The default components with a body: `content-digest` computed (RFC 9530) and covered.
    @Test func aBodyIsDigestedAndCovered() throws {
        var (request, body) = try Self.request()
        let signer = HTTPMessageSigner(
            keyID: "k", algorithm: .hmacSHA256, key: .hmac(Crypto.HMACKey(Array(repeating: 7, count: 32))), keySource: "test",
            components: nil, created: true, expiresAfter: 300, nonce: true, label: "sig1", tag: nil)
        try signer.adaptTry(&request, TryContext(body: body, wallClockMilliseconds: Self.created, attempt: 1))
        #expect(
            request.headerFields[HTTPField.Name("Content-Digest")!]
                == "sha-256=:\(Base64.encode(Crypto.sha256(body))):")
        let input = request.headerFields[HTTPField.Name("Signature-Input")!] ?? ""
        #expect(
            input.hasPrefix(
                "sig1=(\"@method\" \"@authority\" \"@path\" \"@query\" \"content-digest\");created=1618884473;expires=1618884773;nonce=\""
            ))
        #expect(input.hasSuffix(";keyid=\"k\""))
    }
}

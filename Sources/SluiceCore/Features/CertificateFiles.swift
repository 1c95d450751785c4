import COpenSSL

#if canImport(Glibc)
    import Glibc
#endif

/// Reading the files trust evaluators and client certificates name: certificates, keys and
/// CRLs in PEM (one or more blocks) or DER, parsed with OpenSSL once, at config load.
public enum CertificateFiles {
    public struct Problem: Error, Sendable, Equatable {
        public let message: String
    }

    /// Every certificate in the file, as DER.
    public static func certificates(atPath path: String) throws(Problem) -> [[UInt8]] {
        let bytes = try read(path)
        let certs = parse(
            bytes, pem: { PEM_read_bio_X509($0, nil, nil, nil) },
            der: { d2i_X509(nil, $0, $1) }, encode: { i2d_X509($0, $1) }, free: { X509_free($0) })
        guard !certs.isEmpty else { throw Problem(message: "\(path) holds no certificate (PEM or DER expected)") }
        return certs
    }

    /// Every CRL in the file, as DER.
    public static func crls(atPath path: String) throws(Problem) -> [[UInt8]] {
        let bytes = try read(path)
        let crls = parse(
            bytes, pem: { PEM_read_bio_X509_CRL($0, nil, nil, nil) },
            der: { d2i_X509_CRL(nil, $0, $1) }, encode: { i2d_X509_CRL($0, $1) },
            free: { X509_CRL_free($0) })
        guard !crls.isEmpty else { throw Problem(message: "\(path) holds no certificate revocation list") }
        return crls
    }

    /// SHA-256 digests of the SubjectPublicKeyInfo of every certificate in the file, or of
    /// the public (or private) key it holds.
    public static func publicKeyDigests(atPath path: String) throws(Problem) -> [[UInt8]] {
        if let certs = try? certificates(atPath: path) { return certs.compactMap(spkiDigest(ofCertificate:)) }
        let bytes = try read(path)
        let keys =
            parse(
                bytes, pem: { PEM_read_bio_PUBKEY($0, nil, nil, nil) },
                der: { d2i_PUBKEY(nil, $0, $1) }, encode: { i2d_PUBKEY($0, $1) }, free: { EVP_PKEY_free($0) })
            + parse(
                bytes, pem: { PEM_read_bio_PrivateKey($0, nil, { _, _, _, _ in 0 }, nil) },
                der: { d2i_AutoPrivateKey(nil, $0, $1) }, encode: { i2d_PUBKEY($0, $1) }, free: { EVP_PKEY_free($0) })
        guard !keys.isEmpty else {
            throw Problem(message: "\(path) holds no certificate or key (PEM or DER expected; encrypted keys are not read here)")
        }
        return keys.map { Crypto.sha256($0) }
    }

    /// SHA-256 of a DER certificate's SubjectPublicKeyInfo.
    public static func spkiDigest(ofCertificate der: [UInt8]) -> [UInt8]? {
        der.withUnsafeBufferPointer { buf -> [UInt8]? in
            var p: UnsafePointer<UInt8>? = buf.baseAddress
            guard let x509 = d2i_X509(nil, &p, buf.count) else { return nil }
            defer { X509_free(x509) }
            return spkiDigest(of: x509)
        }
    }

    /// SHA-256 of a live certificate's DER SubjectPublicKeyInfo.
    public static func spkiDigest(of x509: OpaquePointer) -> [UInt8]? {
        guard let spki = X509_get_X509_PUBKEY(x509) else { return nil }
        var out: UnsafeMutablePointer<UInt8>?
        let n = i2d_X509_PUBKEY(spki, &out)
        guard n > 0, let out else { return nil }
        defer { CRYPTO_free(out, #fileID, #line) }
        return Crypto.sha256(UnsafeRawBufferPointer(start: out, count: Int(n)))
    }

    /// A live certificate's DER encoding.
    public static func der(of x509: OpaquePointer) -> [UInt8]? {
        var out: UnsafeMutablePointer<UInt8>?
        let n = i2d_X509(x509, &out)
        guard n > 0, let out else { return nil }
        defer { CRYPTO_free(out, #fileID, #line) }
        return Array(UnsafeBufferPointer(start: out, count: Int(n)))
    }

    /// A pin as written in YAML: `sha256/BASE64` (or curl's `sha256//BASE64`) of 32 bytes.
    public static func parsePin(_ text: String) -> [UInt8]? {
        guard text.hasPrefix("sha256/") else { return nil }
        var rest = text.dropFirst(7)
        // curl's `sha256//` form, told apart by length: a 32-byte digest is 44 base64
        // characters, and its base64 may itself start with "/".
        if rest.count == 45, rest.hasPrefix("/") { rest = rest.dropFirst() }
        guard let bytes = Base64.decode(String(rest)), bytes.count == 32 else { return nil }
        return bytes
    }

    // MARK: parsing

    private static func read(_ path: String) throws(Problem) -> [UInt8] {
        guard let f = fopen(path, "rb") else {
            throw Problem(message: "cannot read \(path): \(String(cString: strerror(errno)))")
        }
        defer { fclose(f) }
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let n = fread(&chunk, 1, chunk.count, f)
            if n <= 0 { break }
            out += chunk[0..<n]
            if out.count > 16 << 20 { throw Problem(message: "\(path) is larger than 16 MiB") }
        }
        return out
    }

    /// PEM blocks in order, or one DER object; each re-encoded as DER by `encode`.
    private static func parse(
        _ bytes: [UInt8], pem: (OpaquePointer) -> OpaquePointer?,
        der: (UnsafeMutablePointer<UnsafePointer<UInt8>?>, Int) -> OpaquePointer?,
        encode: (OpaquePointer, UnsafeMutablePointer<UnsafeMutablePointer<UInt8>?>) -> Int32,
        free: (OpaquePointer) -> Void
    ) -> [[UInt8]] {
        defer { ERR_clear_error() }
        var objects: [OpaquePointer] = []
        bytes.withUnsafeBufferPointer { buf in
            guard let base = buf.baseAddress else { return }
            if bytes.starts(with: Array("-----BEGIN".utf8)) || bytes.firstRange(of: Array("-----BEGIN".utf8)) != nil {
                guard let bio = BIO_new_mem_buf(base, Int32(buf.count)) else { return }
                defer { BIO_free(bio) }
                while let object = pem(bio) { objects.append(object) }
            } else {
                var p: UnsafePointer<UInt8>? = base
                if let object = der(&p, buf.count) { objects.append(object) }
            }
        }
        defer { objects.forEach(free) }
        return objects.compactMap { object in
            var out: UnsafeMutablePointer<UInt8>?
            let n = encode(object, &out)
            guard n > 0, let out else { return nil }
            defer { CRYPTO_free(out, #fileID, #line) }
            return Array(UnsafeBufferPointer(start: out, count: Int(n)))
        }
    }
}

/// CRLs parsed once (from `TrustRequirements.crls`) for every handshake that checks them.
/// Immutable after init; OpenSSL 3 locks the lazy lookup state inside an `X509_CRL`, so
/// handshakes on several worker threads may read the same objects.
public final class ParsedCRLs: @unchecked Sendable {
    /// `X509_CRL *`, owned.
    public let objects: [OpaquePointer]

    public init(_ ders: [[UInt8]]) {
        objects = ders.compactMap { der in
            der.withUnsafeBufferPointer { buf in
                var p: UnsafePointer<UInt8>? = buf.baseAddress
                return d2i_X509_CRL(nil, &p, buf.count)
            }
        }
    }

    deinit { for object in objects { X509_CRL_free(object) } }
}

import COpenSSL
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// The local certificate authority interception signs its leaves with (`sluice ca init`):
/// `ca.pem` (the certificate clients are told to trust) and `ca.key` (mode 0600) in one
/// directory. EC P-256, ten years, `CA:TRUE, pathlen:0`.
///
/// Threading: immutable once loaded; OpenSSL objects are only read (signing with a shared
/// key is thread-safe in OpenSSL 3).
public final class LocalCA: @unchecked Sendable {
    public static let certificateFile = "ca.pem"
    public static let keyFile = "ca.key"

    let certificate: OpaquePointer
    let key: OpaquePointer
    public let directory: String

    private init(certificate: OpaquePointer, key: OpaquePointer, directory: String) {
        self.certificate = certificate
        self.key = key
        self.directory = directory
    }

    deinit {
        X509_free(certificate)
        EVP_PKEY_free(key)
    }

    public var certificatePath: String { "\(directory)/\(Self.certificateFile)" }
    public var keyPath: String { "\(directory)/\(Self.keyFile)" }

    /// `AA:BB:…`, as `openssl x509 -fingerprint -sha256` prints it.
    public var fingerprint: String {
        var md = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var n: UInt32 = 0
        X509_digest(certificate, EVP_sha256(), &md, &n)
        return md.prefix(Int(n)).map { b in
            let hex = Array("0123456789ABCDEF")
            return String([hex[Int(b >> 4)], hex[Int(b & 15)]])
        }.joined(separator: ":")
    }

    /// The certificate as PEM.
    public var certificatePEM: String { TLSObjects.pem { PEM_write_bio_X509($0, certificate) } }

    /// The CA certificate in `directory`, as PEM, without reading the key (`sluice ca export`).
    public static func exportCertificate(directory: String) throws(ServerError) -> String {
        let certPath = "\(directory)/\(certificateFile)"
        guard let cert = TLSObjects.read(certPath, { PEM_read_bio_X509($0, nil, nil, nil) }) else {
            throw .ca(.noCertificateToExport(directory: directory))
        }
        defer { X509_free(cert) }
        return TLSObjects.pem { PEM_write_bio_X509($0, cert) }
    }

    /// `tls.ca_dir`'s default for this process (it reads `STATE_DIRECTORY`, set by systemd).
    public static func defaultDirectory() -> String {
        var environment: [String: String] = [:]
        if let state = getenv("STATE_DIRECTORY") { environment["STATE_DIRECTORY"] = String(cString: state) }
        return ServerConfiguration.TLS.defaultCADirectory(environment: environment)
    }

    /// `path` made absolute (against the working directory) and without a trailing slash.
    public static func absolutePath(_ path: String) -> String {
        var path = path
        if !path.hasPrefix("/") {
            var buf = [CChar](repeating: 0, count: Int(PATH_MAX))
            if getcwd(&buf, buf.count) != nil {
                let cwd = String(cBuffer: buf)
                path = (cwd == "/" ? "" : cwd) + "/" + path
            }
        }
        while path.count > 1, path.hasSuffix("/") { path.removeLast() }
        return path
    }

    /// Reads the CA in `directory`; the error says how to make one.
    public static func load(directory: String) throws(ServerError) -> LocalCA {
        let certPath = "\(directory)/\(certificateFile)"
        let keyPath = "\(directory)/\(keyFile)"
        guard access(certPath, R_OK) == 0, access(keyPath, R_OK) == 0 else {
            throw .ca(.missing(directory: directory))
        }
        guard let cert = TLSObjects.read(certPath, { PEM_read_bio_X509($0, nil, nil, nil) }) else {
            throw .ca(.notACertificate(path: certPath))
        }
        guard let key = TLSObjects.read(keyPath, { PEM_read_bio_PrivateKey($0, nil, { _, _, _, _ in 0 }, nil) }) else {
            X509_free(cert)
            throw .ca(.notAKey(path: keyPath))
        }
        guard X509_check_private_key(cert, key) == 1 else {
            X509_free(cert)
            EVP_PKEY_free(key)
            throw .ca(.keyMismatch(key: keyPath, certificate: certPath))
        }
        var st = stat()
        if stat(keyPath, &st) == 0, st.st_mode & 0o077 != 0 {
            Log.warning("\(keyPath) is readable by other users (mode \(String(st.st_mode & 0o777, radix: 8))); it should be 0600")
        }
        return LocalCA(certificate: cert, key: key, directory: directory)
    }

    /// Creates a CA in `directory` (made 0700 when missing). Refuses to replace an existing
    /// one unless `force`; files are written whole or not at all (temporary file + rename).
    public static func create(directory: String, force: Bool) throws(ServerError) -> LocalCA {
        let certPath = "\(directory)/\(certificateFile)"
        let keyPath = "\(directory)/\(keyFile)"
        if !force, access(certPath, F_OK) == 0 || access(keyPath, F_OK) == 0 {
            throw .ca(.exists(directory: directory))
        }
        try makeDirectory(directory)
        guard let key = TLSObjects.generateKey() else { throw .ca(.keyGeneration(reason: TLSObjects.lastError())) }
        guard
            let cert = TLSObjects.makeCertificate(
                subject: "Sluice Local CA", publicKey: key, issuer: nil, signingKey: key, validDays: 3650,
                extensions: [
                    (NID_basic_constraints, "critical,CA:TRUE,pathlen:0"), (NID_key_usage, "critical,keyCertSign,cRLSign"),
                    (NID_subject_key_identifier, "hash"), (NID_authority_key_identifier, "keyid:always"),
                ])
        else {
            EVP_PKEY_free(key)
            throw .ca(.certificateCreation(reason: TLSObjects.lastError()))
        }
        let ca = LocalCA(certificate: cert, key: key, directory: directory)
        // Both files are written to temporaries first and renamed last, so a failure leaves the
        // old pair (or nothing) in place, never a key that does not match the certificate.
        let keyTemporary = try writeTemporary(
            TLSObjects.pem { PEM_write_bio_PrivateKey($0, key, nil, nil, 0, nil, nil) },
            for: keyPath, mode: 0o600)
        let certTemporary: String
        do {
            certTemporary = try writeTemporary(ca.certificatePEM, for: certPath, mode: 0o644)
        } catch {
            unlink(keyTemporary)
            throw error
        }
        guard rename(keyTemporary, keyPath) == 0, rename(certTemporary, certPath) == 0 else {
            let reason = String(cString: strerror(errno))
            unlink(keyTemporary)
            unlink(certTemporary)
            throw .ca(.rename(directory: directory, reason: reason))
        }
        return ca
    }

    private static func makeDirectory(_ path: String) throws(ServerError) {
        var built = ""
        for part in path.split(separator: "/") {
            built += "/" + part
            if mkdir(built, built == path ? 0o700 : 0o755) != 0, errno != EEXIST {
                throw .ca(.directory(path: built, reason: String(cString: strerror(errno))))
            }
        }
    }

    private static func writeTemporary(_ text: String, for path: String, mode: mode_t) throws(ServerError) -> String {
        let temporary = path + ".tmp-\(getpid())"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode)
        guard fd >= 0 else { throw .ca(.write(path: path, reason: String(cString: strerror(errno)))) }
        fchmod(fd, mode)  // whatever the umask
        var bytes = Array(text.utf8)
        let written = bytes.withUnsafeMutableBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        let synced = fsync(fd) == 0
        close(fd)
        guard written == bytes.count, synced else {
            unlink(temporary)
            throw .ca(.write(path: path, reason: String(cString: strerror(errno))))
        }
        bytes.removeAll()
        return temporary
    }
}

/// Why the local CA could not be read or made (`sluice ca …`, or a start or reload that
/// intercepts). The message says what to do about it.
public enum CAError: Error, Equatable, CustomStringConvertible {
    /// `sluice ca export`: no readable certificate in the directory.
    case noCertificateToExport(directory: String)
    /// Interception needs a CA and the directory has none (or it is not readable).
    case missing(directory: String)
    case notACertificate(path: String)
    case notAKey(path: String)
    case keyMismatch(key: String, certificate: String)
    /// `sluice ca init` without `--force` over an existing CA.
    case exists(directory: String)
    case keyGeneration(reason: String)
    case certificateCreation(reason: String)
    case directory(path: String, reason: String)
    case write(path: String, reason: String)
    /// Both files were written but could not be put in place.
    case rename(directory: String, reason: String)

    public var description: String {
        switch self {
        case .noCertificateToExport(let directory):
            return "no CA in \(directory) (\(directory)/\(LocalCA.certificateFile) is missing or not a PEM certificate): "
                + "run 'sluice ca init --dir \(directory)'"
        case .missing(let directory):
            return "no interception CA in \(directory) (or it is not readable): run 'sluice ca init --dir \(directory)'"
        case .notACertificate(let path): return "\(path) holds no PEM certificate"
        case .notAKey(let path): return "\(path) holds no unencrypted PEM private key"
        case .keyMismatch(let key, let certificate): return "\(key) is not the key of \(certificate)"
        case .exists(let directory): return "a CA already exists in \(directory) (use --force to replace it)"
        case .keyGeneration(let reason): return "cannot generate a key: \(reason)"
        case .certificateCreation(let reason): return "cannot make the CA certificate: \(reason)"
        case .directory(let path, let reason): return "cannot create \(path): \(reason)"
        case .write(let path, let reason): return "cannot write \(path): \(reason)"
        case .rename(let directory, let reason): return "cannot write the CA into \(directory): \(reason)"
        }
    }
}

/// Small OpenSSL helpers shared by the CA and the leaf issuer.
enum TLSObjects {
    static func lastError() -> String {
        let code = ERR_get_error()
        return code == 0 ? "unknown OpenSSL error" : describe(code)
    }

    /// OpenSSL's text for an error code (`error:0A000418:SSL routines::tlsv1 alert unknown ca`).
    static func describe(_ code: UInt) -> String {
        var buf = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(code, &buf, buf.count)
        return String(cBuffer: buf)
    }

    /// A new EC P-256 key.
    static func generateKey() -> OpaquePointer? {
        guard let ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_EC, nil) else { return nil }
        defer { EVP_PKEY_CTX_free(ctx) }
        var key: OpaquePointer?
        guard EVP_PKEY_keygen_init(ctx) == 1, EVP_PKEY_CTX_set_ec_paramgen_curve_nid(ctx, NID_X9_62_prime256v1) == 1,
            EVP_PKEY_keygen(ctx, &key) == 1
        else { return nil }
        return key
    }

    /// A certificate for `subject` (CN), signed by `signingKey` as `issuer` (self-signed when
    /// nil), valid from an hour ago for `validDays`, with a random 128-bit serial.
    static func makeCertificate(
        subject: String, publicKey: OpaquePointer, issuer: OpaquePointer?,
        signingKey: OpaquePointer, validDays: Int,
        extensions: [(Int32, String)]
    ) -> OpaquePointer? {
        guard let x = X509_new() else { return nil }
        var ok = X509_set_version(x, 2) == 1
        var serial = Crypto.randomBytes(16)
        serial[0] &= 0x7F
        if let bn = BN_bin2bn(serial, Int32(serial.count), nil) {
            ok = ok && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) != nil
            BN_free(bn)
        }
        ok = ok && X509_gmtime_adj(X509_getm_notBefore(x), -3600) != nil
        ok = ok && X509_gmtime_adj(X509_getm_notAfter(x), validDays * 86400) != nil
        ok = ok && X509_set_pubkey(x, publicKey) == 1
        if let name = X509_NAME_new() {
            // A CN is at most 64 characters (RFC 5280); longer host names live in the SAN only,
            // which is what clients check.
            let cn = subject.utf8.count <= 64 ? subject : String(subject.prefix(60)) + "..."
            ok = ok && X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, cn, -1, -1, 0) == 1
            ok = ok && X509_set_subject_name(x, name) == 1
            X509_NAME_free(name)
        }
        ok = ok && X509_set_issuer_name(x, issuer.map { X509_get_subject_name($0) } ?? X509_get_subject_name(x)) == 1
        var v3 = X509V3_CTX()
        X509V3_set_ctx(&v3, issuer ?? x, x, nil, nil, 0)
        for (nid, value) in extensions where ok {
            guard let ext = X509V3_EXT_conf_nid(nil, &v3, nid, value) else {
                ok = false
                break
            }
            ok = X509_add_ext(x, ext, -1) == 1
            X509_EXTENSION_free(ext)
        }
        ok = ok && X509_sign(x, signingKey, EVP_sha256()) > 0
        guard ok else {
            X509_free(x)
            return nil
        }
        return x
    }

    static func pem(_ write: (OpaquePointer) -> Int32) -> String {
        guard let bio = BIO_new(BIO_s_mem()) else { return "" }
        defer { BIO_free(bio) }
        _ = write(bio)
        var data: UnsafeMutablePointer<CChar>?
        let n = BIO_ctrl(bio, BIO_CTRL_INFO, 0, &data)
        guard n > 0, let data else { return "" }
        return String(decoding: UnsafeRawBufferPointer(start: data, count: n), as: UTF8.self)
    }

    static func read(_ path: String, _ parse: (OpaquePointer) -> OpaquePointer?) -> OpaquePointer? {
        guard let bio = BIO_new_file(path, "r") else { return nil }
        defer { BIO_free(bio) }
        return parse(bio)
    }
}

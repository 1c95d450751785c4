import COpenSSL

/// The digests and signatures Sluice's own code computes (signers, `sluice.hmac_sha256`),
/// each one OpenSSL call: nothing here keeps state between calls, so any thread may use it.
public enum Crypto {
    /// OpenSSL 3's SHA-256, fetched once: the one-shot `SHA256()` and `HMAC()` look the
    /// algorithm up by name on every call, which cost a signer more than the hashing itself.
    private final class Digest: @unchecked Sendable {
        // Immutable after init; OpenSSL's fetched methods are shared read-only across threads.
        let md: OpaquePointer
        init() { md = EVP_MD_fetch(nil, "SHA256", nil) }
    }
    private static let digest = Digest()

    /// SHA-256 of `bytes` (32 bytes).
    public static func sha256(_ bytes: [UInt8]) -> [UInt8] {
        bytes.withUnsafeBytes { sha256($0) }
    }

    public static func sha256(_ bytes: UnsafeRawBufferPointer) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        out.withUnsafeMutableBytes { sha256(bytes, into: $0.baseAddress!) }
        return out
    }

    /// SHA-256 of `bytes` written to the 32 bytes at `out` (no allocation: the disk tier checks
    /// every block it reads with it).
    public static func sha256(_ bytes: UnsafeRawBufferPointer, into out: UnsafeMutableRawPointer) {
        var length: UInt32 = 0
        _ = EVP_Digest(bytes.baseAddress, bytes.count, out.assumingMemoryBound(to: UInt8.self), &length, digest.md, nil)
    }

    /// HMAC-SHA256 of `data` under `key` (32 bytes). For a key used many times, make an
    /// `HMACKey` once.
    public static func hmacSHA256(key: [UInt8], _ data: [UInt8]) -> [UInt8] {
        HMACKey(key).mac(data)
    }

    /// An HMAC-SHA256 key with its inner and outer hash states computed once (RFC 2104): each
    /// MAC then costs the message's blocks and two more, with no key setup.
    ///
    /// Threading: immutable after init; `mac` copies the states into a context of its own, so
    /// any thread may use one key.
    public final class HMACKey: @unchecked Sendable {
        private let inner: OpaquePointer
        private let outer: OpaquePointer

        public init(_ key: [UInt8]) {
            var block = key.count > 64 ? Crypto.sha256(key) : key
            block += [UInt8](repeating: 0, count: 64 - block.count)
            inner = EVP_MD_CTX_new()
            outer = EVP_MD_CTX_new()
            _ = EVP_DigestInit_ex(inner, Crypto.digest.md, nil)
            _ = EVP_DigestInit_ex(outer, Crypto.digest.md, nil)
            let ipad = block.map { $0 ^ 0x36 }
            let opad = block.map { $0 ^ 0x5c }
            _ = EVP_DigestUpdate(inner, ipad, 64)
            _ = EVP_DigestUpdate(outer, opad, 64)
        }

        deinit {
            EVP_MD_CTX_free(inner)
            EVP_MD_CTX_free(outer)
        }

        public func mac(_ data: [UInt8]) -> [UInt8] {
            data.withUnsafeBytes { mac($0) }
        }

        public func mac(_ data: UnsafeRawBufferPointer) -> [UInt8] {
            let context = EVP_MD_CTX_new()
            defer { EVP_MD_CTX_free(context) }
            var out = [UInt8](repeating: 0, count: 32)
            var length: UInt32 = 0
            _ = EVP_MD_CTX_copy_ex(context, inner)
            _ = EVP_DigestUpdate(context, data.baseAddress, data.count)
            _ = EVP_DigestFinal_ex(context, &out, &length)
            _ = EVP_MD_CTX_copy_ex(context, outer)
            _ = EVP_DigestUpdate(context, out, 32)
            _ = EVP_DigestFinal_ex(context, &out, &length)
            return out
        }
    }

    /// An Ed25519 private key (RFC 8032), read once from PEM (PKCS #8); signs on any thread.
    public final class Ed25519Key: @unchecked Sendable {
        // Immutable after init; EVP_DigestSign takes a context of its own per call.
        private let key: OpaquePointer

        /// nil when `pem` holds no Ed25519 private key.
        public init?(pem: String) {
            var bytes = Array(pem.utf8)
            guard let bio = bytes.withUnsafeMutableBytes({ BIO_new_mem_buf($0.baseAddress, Int32($0.count)) }) else {
                return nil
            }
            defer { BIO_free(bio) }
            guard let key = PEM_read_bio_PrivateKey(bio, nil, nil, nil) else { return nil }
            guard EVP_PKEY_get_id(key) == EVP_PKEY_ED25519 else {
                EVP_PKEY_free(key)
                return nil
            }
            self.key = key
        }

        deinit { EVP_PKEY_free(key) }

        /// The 64-byte signature of `message` (Ed25519 is deterministic: same key, same message,
        /// same signature).
        public func sign(_ message: [UInt8]) -> [UInt8]? {
            guard let context = EVP_MD_CTX_new() else { return nil }
            defer { EVP_MD_CTX_free(context) }
            guard EVP_DigestSignInit(context, nil, nil, nil, key) == 1 else { return nil }
            var signature = [UInt8](repeating: 0, count: 64)
            var length = 64
            let ok = message.withUnsafeBytes { m in
                EVP_DigestSign(context, &signature, &length, m.baseAddress?.assumingMemoryBound(to: UInt8.self), m.count)
            }
            return ok == 1 ? Array(signature.prefix(length)) : nil
        }
    }

    /// `count` random bytes from OpenSSL's generator.
    public static func randomBytes(_ count: Int) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: count)
        _ = RAND_bytes(&bytes, Int32(count))
        return bytes
    }
}

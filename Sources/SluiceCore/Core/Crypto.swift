import COpenSSL

/// The digests and signatures Sluice's own code computes (signers, `sluice.hmac_sha256`),
/// each one OpenSSL call: nothing here keeps state between calls, so any thread may use it.
public enum Crypto {
    /// SHA-256 of `bytes` (32 bytes).
    public static func sha256(_ bytes: [UInt8]) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: Int(SHA256_DIGEST_LENGTH))
        bytes.withUnsafeBytes { raw in
            _ = SHA256(raw.baseAddress?.assumingMemoryBound(to: UInt8.self), raw.count, &digest)
        }
        return digest
    }

    /// HMAC-SHA256 of `data` under `key` (32 bytes).
    public static func hmacSHA256(key: [UInt8], _ data: [UInt8]) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        key.withUnsafeBytes { k in
            data.withUnsafeBytes { d in
                _ = HMAC(
                    EVP_sha256(), k.baseAddress, Int32(k.count), d.baseAddress?.assumingMemoryBound(to: UInt8.self),
                    d.count, &digest, &length)
            }
        }
        return Array(digest.prefix(Int(length)))
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

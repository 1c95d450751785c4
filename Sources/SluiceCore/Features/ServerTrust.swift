/// Alamofire's `ServerTrustEvaluating`, rebuilt for OpenSSL: an evaluator does not look at a
/// `SecTrust` after the fact; it states what a TLS handshake must prove, and the session core
/// enforces that during the handshake (libcurl's verification plus Sluice's own check of
/// pins and CRLs), before any request byte is sent. Evaluators compose by adding demands.
public protocol ServerTrustEvaluating: Sendable {
    /// The YAML name, used in errors and logs (`public_keys`, `composite(default, public_keys)`).
    var name: String { get }
    /// What a handshake must prove for this evaluator to pass.
    var requirements: TrustRequirements { get }
}

/// The demands of one or more evaluators on a TLS handshake. Every demand must be met
/// (`composite` merges its members' requirements with `adding(_:)`). Hashable: the native
/// transport keeps one TLS context per distinct set.
public struct TrustRequirements: Sendable, Hashable {
    /// The server's chain must verify against `caFile` (or the process's CA bundle).
    public var validateChain = true
    /// The certificate must name the host.
    public var validateHost = true
    /// A PEM bundle of anchors for this evaluator; nil means `tls.ca_file` or the system store.
    public var caFile: String?
    /// DER certificate revocation lists; the leaf is checked against them.
    public var crls: [[UInt8]] = []
    /// The server must staple a good OCSP response.
    public var requireOCSP = false
    /// Each set must have a member equal (DER) to a certificate of the server's chain.
    public var certificatePins: [Set<[UInt8]>] = []
    /// Each set must have a member equal to the SHA-256 of a chain certificate's
    /// SubjectPublicKeyInfo.
    public var publicKeyPins: [Set<[UInt8]>] = []
    /// Verification is off (`disabled`): the only evaluator for which this holds.
    public var insecure = false

    public init() {}

    /// The chain, host and anchor settings every verifying evaluator has.
    public init(validateChain: Bool = true, validateHost: Bool, caFile: String?) {
        self.validateChain = validateChain
        self.validateHost = validateHost
        self.caFile = caFile
    }

    /// The checks libcurl cannot make and Sluice's handshake callback does.
    public var needsOwnCheck: Bool { !crls.isEmpty || !certificatePins.isEmpty || !publicKeyPins.isEmpty }

    /// Plain chain-and-host verification: libcurl alone enforces it, and its connection and
    /// TLS session matching already tell such settings apart.
    public var isCurlNative: Bool { !needsOwnCheck && !insecure && !requireOCSP }

    /// Both sets of demands at once ("all must pass").
    public func adding(_ other: TrustRequirements) -> TrustRequirements {
        var out = self
        out.validateChain = validateChain || other.validateChain
        out.validateHost = validateHost || other.validateHost
        out.caFile = caFile ?? other.caFile
        out.crls += other.crls
        out.requireOCSP = requireOCSP || other.requireOCSP
        out.certificatePins += other.certificatePins
        out.publicKeyPins += other.publicKeyPins
        out.insecure = insecure && other.insecure
        return out
    }
}

/// `default`: the chain against the system CAs (or `ca_file`), and the host name.
public struct DefaultTrustEvaluator: ServerTrustEvaluating {
    public var caFile: String?
    public var validateHost: Bool
    public init(caFile: String? = nil, validateHost: Bool = true) {
        self.caFile = caFile
        self.validateHost = validateHost
    }
    public var name: String { "default" }
    public var requirements: TrustRequirements { TrustRequirements(validateHost: validateHost, caFile: caFile) }
}

/// `revocation`: `default`, plus the leaf checked against CRLs and, with `requireOCSP`, a
/// stapled OCSP response that must say "good".
public struct RevocationTrustEvaluator: ServerTrustEvaluating {
    public var crls: [[UInt8]]
    public var requireOCSP: Bool
    public var caFile: String?
    public var validateHost: Bool
    public init(crls: [[UInt8]], requireOCSP: Bool = false, caFile: String? = nil, validateHost: Bool = true) {
        self.crls = crls
        self.requireOCSP = requireOCSP
        self.caFile = caFile
        self.validateHost = validateHost
    }
    public var name: String { "revocation" }
    public var requirements: TrustRequirements {
        var r = TrustRequirements(validateHost: validateHost, caFile: caFile)
        r.crls = crls
        r.requireOCSP = requireOCSP
        return r
    }
}

/// `pinned_certificates`: passes when a certificate the server presents equals a pinned one.
/// With `validateChain: false` a pinned self-signed certificate is accepted.
public struct PinnedCertificatesTrustEvaluator: ServerTrustEvaluating {
    /// DER certificates.
    public var certificates: [[UInt8]]
    public var validateChain: Bool
    public var validateHost: Bool
    public var caFile: String?
    public init(certificates: [[UInt8]], validateChain: Bool = true, validateHost: Bool = true, caFile: String? = nil) {
        self.certificates = certificates
        self.validateChain = validateChain
        self.validateHost = validateHost
        self.caFile = caFile
    }
    public var name: String { "pinned_certificates" }
    public var requirements: TrustRequirements {
        var r = TrustRequirements(validateChain: validateChain, validateHost: validateHost, caFile: caFile)
        r.certificatePins = [Set(certificates)]
        return r
    }
}

/// `public_keys`: passes when the SHA-256 of a presented certificate's SubjectPublicKeyInfo
/// equals a pin (HPKP's `sha256/BASE64` pins, the form `openssl` computes).
public struct PublicKeysTrustEvaluator: ServerTrustEvaluating {
    /// SHA-256 digests of DER SubjectPublicKeyInfo.
    public var keyDigests: [[UInt8]]
    public var validateChain: Bool
    public var validateHost: Bool
    public var caFile: String?
    public init(keyDigests: [[UInt8]], validateChain: Bool = true, validateHost: Bool = true, caFile: String? = nil) {
        self.keyDigests = keyDigests
        self.validateChain = validateChain
        self.validateHost = validateHost
        self.caFile = caFile
    }
    public var name: String { "public_keys" }
    public var requirements: TrustRequirements {
        var r = TrustRequirements(validateChain: validateChain, validateHost: validateHost, caFile: caFile)
        r.publicKeyPins = [Set(keyDigests)]
        return r
    }
}

/// `composite`: every member must pass.
public struct CompositeTrustEvaluator: ServerTrustEvaluating {
    public var evaluators: [any ServerTrustEvaluating]
    public init(evaluators: [any ServerTrustEvaluating]) { self.evaluators = evaluators }
    public var name: String { "composite(\(evaluators.map(\.name).joined(separator: ", ")))" }
    public var requirements: TrustRequirements {
        guard let first = evaluators.first else { return TrustRequirements() }
        return evaluators.dropFirst().reduce(first.requirements) { $0.adding($1.requirements) }
    }
}

/// `disabled`: no verification at all. Only with an explicit `insecure: true`; Sluice warns
/// at start and marks every request it applies to in the access log.
public struct DisabledTrustEvaluator: ServerTrustEvaluating {
    public init() {}
    public var name: String { "disabled" }
    public var requirements: TrustRequirements {
        var r = TrustRequirements()
        r.validateChain = false
        r.validateHost = false
        r.insecure = true
        return r
    }
}

/// A host's trust as the session core applies it: the evaluator's name and its requirements,
/// computed once per policy load. A reference type so a TLS callback can hold it.
public final class ServerTrust: Sendable {
    public let evaluatorName: String
    public let requirements: TrustRequirements
    /// False when no evaluator was configured for the host and `tls.all_hosts_must_be_evaluated`
    /// is on: connections to it are refused.
    public let isAllowed: Bool
    /// `requirements.crls`, parsed once at load.
    public let crls: ParsedCRLs

    public init(_ evaluator: any ServerTrustEvaluating) {
        evaluatorName = evaluator.name
        requirements = evaluator.requirements
        isAllowed = true
        crls = ParsedCRLs(requirements.crls)
    }

    private init(refusing: Void) {
        evaluatorName = "none"
        requirements = TrustRequirements()
        isAllowed = false
        crls = ParsedCRLs([])
    }

    /// The built-in `default` evaluator: what a host without a `trust` section gets.
    public static let builtInDefault = ServerTrust(DefaultTrustEvaluator())
    /// What a host without a `trust` section gets when every host must be evaluated.
    public static let refused = ServerTrust(refusing: ())

    /// The error for a connection to `authority` that this trust refuses outright.
    public func refusal(authority: String) -> ProxyError {
        .trustFailure(
            host: authority, evaluator: evaluatorName,
            reason: "no trust evaluator is configured for this host (tls.all_hosts_must_be_evaluated)")
    }
}

/// `upstream:` in a policy: where a host's plain-HTTP requests really go, and how Sluice talks
/// to the host's origin. With `scheme: https` a plain-HTTP client's request is sent to the
/// origin over TLS, under the host's trust; `http2` (HTTP2.swift) picks the HTTP version;
/// `engine` (UpstreamEngine.swift) forces a transport.
public struct UpstreamOverride: Sendable, Equatable {
    public enum Scheme: String, Sendable { case http, https }
    /// The scheme plain-HTTP requests are sent with; nil keeps theirs (a section that only
    /// sets `http2`).
    public var scheme: Scheme?
    /// The origin's port; nil keeps the URL's explicit port, else the scheme's default.
    public var port: Int?
    /// `http2:`, default `auto`.
    public var http2: HTTP2Mode
    /// `engine:` (`native` or `curl`); nil, the default, leaves the choice to
    /// `UpstreamEngine.choose` per try.
    public var engine: UpstreamEngine?
    public init(scheme: Scheme?, port: Int? = nil, http2: HTTP2Mode = .auto, engine: UpstreamEngine? = nil) {
        self.scheme = scheme
        self.port = port
        self.http2 = http2
        self.engine = engine
    }
}

/// `client_certificate:` in a policy: the certificate (and key) Sluice presents to the host's
/// origin when it asks for one (mTLS).
public struct ClientCertificate: Sendable, Equatable {
    /// PEM certificate file (may hold the chain).
    public var certificate: String
    /// PEM private key file.
    public var key: String
    public var passphrase: Secret?
    public init(certificate: String, key: String, passphrase: Secret? = nil) {
        self.certificate = certificate
        self.key = key
        self.passphrase = passphrase
    }
}

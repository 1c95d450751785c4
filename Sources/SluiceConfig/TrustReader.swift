import SluiceCore

/// Reading of the TLS sections of a policy: `trust`, `upstream`, `client_certificate`,
/// `intercept`. Files named here (certificates, keys, CRLs) are read at load, so a bad one
/// is a config error with its location, not a failed handshake later.
extension NodeReader {
    static let evaluatorNames = ["default", "revocation", "pinned_certificates", "public_keys", "composite", "disabled"]

    mutating func readTrust(_ node: YAMLNode, policy: String) -> PolicyEntry.Section<any ServerTrustEvaluating> {
        guard let evaluator = readEvaluator(node, policy: policy, nested: false) else { return .inherit }
        return .on(evaluator)
    }

    /// One evaluator: a bare word (`default`) or a map with exactly one evaluator key and
    /// its options beside it.
    private mutating func readEvaluator(_ node: YAMLNode, policy: String, nested: Bool) -> (any ServerTrustEvaluating)? {
        let usage =
            "trust must be default, or a map with one evaluator (\(Self.evaluatorNames.joined(separator: ", "))) and its options"
        if let word = node.scalar?.string {
            switch word {
            case "default": return DefaultTrustEvaluator()
            case "disabled":
                fail(
                    node,
                    "trust: disabled turns certificate verification off; write { disabled: true, insecure: true } to say you mean it"
                )
                return nil
            default:
                unknownEvaluator(word, at: node, usage: usage)
                return nil
            }
        }
        guard case .mapping(let m) = node else {
            fail(node, usage)
            return nil
        }
        let present = m.compactMap { key, _ in key.scalar?.string }.filter { Self.evaluatorNames.contains($0) }
        guard present.count == 1, let kind = present.first else {
            let optionNames: Set<String> = ["ca_file", "validate_host", "validate_chain", "ocsp", "insecure"]
            if present.count > 1 {
                fail(node, "trust names \(present.joined(separator: " and ")); use composite: [...] to combine evaluators")
            } else if let unknown = m.first(where: { key, _ in !optionNames.contains(key.scalar?.string ?? "") })?.key,
                let name = unknown.scalar?.string
            {
                unknownEvaluator(name, at: unknown, usage: usage)
            } else {
                fail(node, "trust has options but no evaluator; " + usage)
            }
            return nil
        }
        if kind == "disabled", nested {
            fail(node, "disabled cannot be part of a composite (a composite needs every member to pass)")
            return nil
        }
        let options: [String]
        switch kind {
        case "default": options = ["ca_file", "validate_host"]
        case "revocation": options = ["ca_file", "validate_host", "ocsp"]
        case "pinned_certificates", "public_keys": options = ["ca_file", "validate_host", "validate_chain"]
        case "disabled": options = ["insecure"]
        default: options = []
        }
        var caFile: String?
        var validateHost = true
        var validateChain = true
        var ocsp = false
        var insecure = false
        var evaluatorValue: YAMLNode?
        entries(node, in: "trust (\(kind))", known: [kind] + options) { r, key, value in
            switch key {
            case kind: evaluatorValue = value
            case "ca_file":
                if let path = value.scalar?.string, FileContents.isReadable(atPath: path) {
                    caFile = path
                } else {
                    r.fail(value, "ca_file must be a readable PEM file")
                }
            case "validate_host": validateHost = r.bool(value, key: key) ?? true
            case "validate_chain": validateChain = r.bool(value, key: key) ?? true
            case "insecure": insecure = r.bool(value, key: key) ?? false
            default:
                switch value.scalar?.string {
                case "require": ocsp = true
                case "off": ocsp = false
                default: r.fail(value, "ocsp must be require or off")
                }
            }
        }
        guard let value = evaluatorValue else { return nil }
        switch kind {
        case "default":
            guard let on = bool(value, key: "default") else { return nil }
            guard on else {
                fail(value, "default: false is not an evaluator; write default: true, or name another evaluator")
                return nil
            }
            return DefaultTrustEvaluator(caFile: caFile, validateHost: validateHost)
        case "revocation":
            var crls: [[UInt8]] = []
            let files = strings(value, what: "revocation (CRL files)") ?? []
            for (path, n) in files {
                do { crls += try CertificateFiles.crls(atPath: path) } catch { fail(n, error.message) }
            }
            if files.isEmpty && !ocsp {
                fail(value, "revocation needs CRL files, or ocsp: require")
            }
            return RevocationTrustEvaluator(crls: crls, requireOCSP: ocsp, caFile: caFile, validateHost: validateHost)
        case "pinned_certificates":
            var certs: [[UInt8]] = []
            for (path, n) in nonEmptyList(value, what: "pinned_certificates") {
                do { certs += try CertificateFiles.certificates(atPath: path) } catch { fail(n, error.message) }
            }
            return PinnedCertificatesTrustEvaluator(
                certificates: certs, validateChain: validateChain,
                validateHost: validateHost, caFile: caFile)
        case "public_keys":
            var digests: [[UInt8]] = []
            for (text, n) in nonEmptyList(value, what: "public_keys") {
                if text.hasPrefix("sha256/") {
                    if let pin = CertificateFiles.parsePin(text) {
                        digests.append(pin)
                    } else {
                        fail(n, "'\(text)' is not a pin: expected sha256/ and the base64 of 32 bytes (see docs/trust.md)")
                    }
                    continue
                }
                do { digests += try CertificateFiles.publicKeyDigests(atPath: text) } catch { fail(n, error.message) }
            }
            return PublicKeysTrustEvaluator(
                keyDigests: digests, validateChain: validateChain,
                validateHost: validateHost, caFile: caFile)
        case "composite":
            guard case .sequence(let items) = value, !items.isEmpty else {
                fail(value, "composite must be a list of evaluators, e.g. [default, { public_keys: [...] }]")
                return nil
            }
            let members = items.compactMap { readEvaluator($0, policy: policy, nested: true) }
            let caFiles = Set(members.compactMap { $0.requirements.caFile })
            if caFiles.count > 1 { fail(value, "composite members name different ca_file values; use one") }
            return members.count == items.count ? CompositeTrustEvaluator(evaluators: members) : nil
        default:  // disabled
            guard let on = bool(value, key: "disabled") else { return nil }
            guard on else {
                fail(value, "disabled: false is not an evaluator; remove the trust section to get the default")
                return nil
            }
            guard insecure else {
                fail(value, "trust: disabled turns certificate verification off; add 'insecure: true' to say you mean it")
                return nil
            }
            return DisabledTrustEvaluator()
        }
    }

    private mutating func unknownEvaluator(_ word: String, at node: YAMLNode, usage: String) {
        var message = "unknown trust evaluator '\(word)'"
        if let s = DidYouMean.closest(to: word, among: Self.evaluatorNames) {
            message += "; did you mean '\(s)'?"
        } else {
            message += "; \(usage)"
        }
        fail(node, message)
    }

    private mutating func nonEmptyList(_ node: YAMLNode, what: String) -> [(String, YAMLNode)] {
        let items = strings(node, what: what) ?? []
        if items.isEmpty { fail(node, "\(what) needs at least one entry") }
        return items
    }

    /// A plain path, or the value of `${ENV}` (resolved as secret references are, with their
    /// errors; the path itself is not a secret).
    public mutating func pathOrReference(_ text: String, at node: YAMLNode) -> String? {
        guard text.hasPrefix("${") else { return text }
        switch SecretReference.resolve(text) {
        case .success(let resolved): return resolved.value
        case .failure(let problem):
            fail(node, problem.message)
            return nil
        }
    }

    /// A policy's `upstream:` section: `scheme`, `port` (where plain-HTTP requests go),
    /// `http2` (Sources/SluiceCore/Features/HTTP2.swift) and `engine`
    /// (Sources/SluiceCore/Features/UpstreamEngine.swift).
    mutating func readUpstream(_ node: YAMLNode) -> PolicyEntry.Section<UpstreamOverride> {
        if node.scalar?.string == "off" { return .off }
        guard case .mapping(let m) = node else {
            fail(
                node,
                "upstream must be a map, e.g. { scheme: https }, { scheme: https, port: 8443 }, { http2: off } or { engine: curl }"
            )
            return .inherit
        }
        var scheme: UpstreamOverride.Scheme?
        var port: Int?
        var http2 = HTTP2Mode.auto
        var engine: UpstreamEngine?
        var engineNode: YAMLNode?
        var valid = true
        entries(node, in: "upstream", known: ["scheme", "port", "http2", "engine"]) { r, key, value in
            switch key {
            case "scheme":
                if let s = value.scalar.flatMap({ UpstreamOverride.Scheme(rawValue: $0.string) }) {
                    scheme = s
                } else {
                    r.fail(value, "scheme must be http or https")
                    valid = false
                }
            case "http2":
                if let mode = value.scalar.flatMap({ HTTP2Mode(rawValue: $0.string) }) {
                    http2 = mode
                } else {
                    r.fail(value, "http2 must be auto, off or prior_knowledge")
                    valid = false
                }
            case "engine":
                if let e = value.scalar.flatMap({ UpstreamEngine(rawValue: $0.string) }) {
                    engine = e
                    engineNode = value
                } else {
                    r.fail(value, "engine must be native or curl")
                    valid = false
                }
            default:
                if let n = value.scalar.flatMap({ Int($0.string) }), (1...65535).contains(n) {
                    port = n
                } else {
                    r.fail(value, "port must be 1 to 65535")
                    valid = false
                }
            }
        }
        let written = Set(m.compactMap { k, _ in k.scalar?.string })
        if scheme == nil, written.contains("port"), !written.contains("scheme") {
            fail(node, "upstream.port needs scheme (http or https)")
            return .inherit
        }
        if written.isEmpty {
            fail(node, "upstream needs scheme (http or https), http2 or engine")
            return .inherit
        }
        // The native engine speaks HTTP/1.1 only (over TLS too): a section that sends the
        // host's requests as h2c cannot also force it (UpstreamEngine.choose would silently
        // pick curl).
        if engine == .native, let engineNode, http2 == .priorKnowledge, scheme != .https {
            fail(
                engineNode,
                "engine: native speaks HTTP/1.1 only, so it cannot serve http2: prior_knowledge (h2c); "
                    + "remove engine (h2c uses curl) or write http2: auto or off")
            return .inherit
        }
        guard valid else { return .inherit }
        return .on(UpstreamOverride(scheme: scheme, port: port, http2: http2, engine: engine))
    }

    mutating func readClientCertificate(_ node: YAMLNode) -> PolicyEntry.Section<ClientCertificate> {
        if node.scalar?.string == "off" { return .off }
        var certificate: String?
        var key: String?
        var passphrase: Secret?
        entries(node, in: "client_certificate", known: ["certificate", "key", "passphrase"]) { r, k, value in
            switch k {
            case "passphrase": passphrase = r.secret(value, what: "passphrase")
            default:
                // A path, or `${ENV}` naming one (the files differ per machine; the path is not secret).
                guard let text = value.scalar?.string else { return r.fail(value, "\(k) must be a path") }
                guard let path = r.pathOrReference(text, at: value) else { return }
                guard FileContents.isReadable(atPath: path) else {
                    return r.fail(value, "\(k) must be a readable PEM file ('\(path)' is not)")
                }
                if k == "certificate" {
                    do throws(CertificateFiles.Problem) { _ = try CertificateFiles.certificates(atPath: path) } catch {
                        r.fail(value, error.message)
                    }
                    certificate = path
                } else {
                    key = path
                }
            }
        }
        guard let certificate, let key else {
            // Only when a key is missing: a bad file was reported where it was written.
            if case .mapping(let m) = node {
                let written = Set(m.compactMap { k, _ in k.scalar?.string })
                if !written.contains("certificate") || !written.contains("key") {
                    fail(node, "client_certificate needs certificate and key")
                }
            }
            return .inherit
        }
        return .on(ClientCertificate(certificate: certificate, key: key, passphrase: passphrase))
    }
}

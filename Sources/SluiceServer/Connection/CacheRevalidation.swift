import SluiceCore

/// A background revalidation of a stored response served stale inside its
/// `stale-while-revalidate` window (RFC 5861 §3; docs/caching.md): a conditional `GET` with
/// the stored validators, made as a `SideFetch` on the worker's libcurl multi — so it is not
/// tied to the client connection that triggered it, which has its answer already and may
/// leave. It goes with the policy's trust, parent proxy, `upstream:` override and the
/// `access.deny` check, like every request Sluice makes for itself, and as a try of its own
/// (`BackgroundTry`: its circuit, its `rate_limit` turn, the metrics). One runs per URL at a
/// time across workers: it holds the store's fetch claim (`CacheStore.beginFetch`) until it
/// ends, and a lookup that finds the URL being fetched serves stale without starting another.
///
/// Outcomes: `304` merges the new fields into the stored response (RFC 9111 §4.3.4); a
/// storable response replaces it; a response that may not be stored drops it; a `5xx` or a
/// failure (no connection, timeout, larger than `max_object_size`) leaves it as it is.
///
/// Threading: created, run and completed on one worker's thread (the `SideFetch` keeps
/// itself alive until libcurl is done with its handle, then calls back on that thread).
enum CacheRevalidation {
    /// The request fields not copied to the background request: hop-by-hop fields, the
    /// client's own conditionals and range (the stored validators replace them), the
    /// credentials for this proxy.
    static let droppedRequestFields: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
        "proxy-authorization", "host", "content-length", "expect", "range", "if-range", "if-match",
        "if-none-match", "if-modified-since", "if-unmodified-since",
    ]
    /// Response fields not kept (hop-by-hop).
    static let hopByHopResponseFields: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
    ]

    /// Starts the revalidation of `object` under the claim `token` on `url` (ended when it
    /// completes, whatever the outcome).
    static func start(
        _ object: CacheObject, url: String, token: UInt64, validators: [CacheLookup.Validator],
        requestFields: [CacheFields.Field], hostHeader: String?, modification: CacheModification?,
        store: CacheStore, worker: Worker, as admitted: BackgroundTry
    ) {
        let policy = worker.pipeline.policies.match(host: URLParts(url).host)
        let disk = worker.diskTier
        var headers: [(String, String)] = requestFields.compactMap {
            droppedRequestFields.contains($0.name.lowercased()) ? nil : ($0.name, $0.value)
        }
        if let hostHeader { headers.append(("Host", hostHeader)) }
        headers += validators.map { ($0.name, $0.value) }
        let requestTime = CacheStage.wallClockSeconds()
        // An https entry records the trust it is validated under: this pipeline's.
        let trustGeneration = object.trustGeneration == nil ? nil : worker.pipeline.policies.generation
        let received = ReceivedFields()
        let fetch = SideFetch(
            session: worker.session, config: worker.config, policy: policy, url: url, headers: headers,
            body: nil, reuse: UpstreamTLS.reuse(current: worker.pipeline, exchangeSnapshot: nil),
            completion: { result in
                defer { store.endFetch(url, token: token) }
                switch result {
                case .success(let response): admitted.finish(HealthOutcome(status: response.status))
                case .failure(let error): admitted.finish(HealthOutcome(error: error))
                }
                guard case .success(let response) = result else {
                    Log.debug("cache: background revalidation of \(url) failed; the stale response stays")
                    return
                }
                let fields = received.fields.filter { !hopByHopResponseFields.contains($0.name.lowercased()) }
                finish(
                    object, url: url, status: response.status, fields: fields, body: response.body,
                    requestFields: requestFields, requestTime: requestTime, modification: modification,
                    policyAuthenticates: policy.credentials != nil || !policy.adapters.isEmpty, store: store,
                    disk: disk, trustGeneration: trustGeneration)
            })
        // The answer is held in memory until it completes: at most what the memory tier keeps
        // (a larger new body leaves the stale entry, validated blocking once the window ends).
        fetch.maxBytes = Int(store.settings.memoryObjectSize)
        fetch.fieldsSink = { received.fields = $0 }  // called just before the completion
        fetch.start()
    }

    /// Applies the origin's answer to the store (see the type's note).
    static func finish(
        _ object: CacheObject, url: String, status: Int, fields: [CacheFields.Field], body: [UInt8],
        requestFields: [CacheFields.Field], requestTime: Int64, modification: CacheModification?,
        policyAuthenticates: Bool, store: CacheStore, disk: DiskCacheTier?, trustGeneration: UInt64? = nil
    ) {
        let now = CacheStage.wallClockSeconds()
        var keyFields = requestFields
        if policyAuthenticates { keyFields.append(("Authorization", "")) }
        if status == 304 {
            // The 304's fields pass the storage rules (no Set-Cookie, drop_response_headers);
            // a merge that may no longer be stored drops the entry.
            guard
                let kept = CacheStorability.afterNotModified(
                    object.response, notModified: fields, requestFields: keyFields,
                    modification: modification, requestTime: requestTime,
                    responseTime: now)
            else {
                disk?.remove(key: url)
                store.memory.invalidate(url)
                return
            }
            _ = CacheStage.storeValidated(
                object.withResponse(kept, trustGeneration: trustGeneration), url: url, store: store, disk: disk)
            Log.debug("cache: \(url) revalidated in the background (304)")
            return
        }
        if status >= 500 { return }
        let contentLength = CacheFields.value("content-length", in: fields).flatMap { Int64($0) }
        let decision = CacheStorability.decide(
            method: "GET", requestFields: keyFields, status: status,
            responseFields: fields, modification: modification,
            contentLength: contentLength, maxObjectSize: store.maxObjectSize)
        guard decision == .store else {
            disk?.remove(key: url)
            store.memory.invalidate(url)  // the origin's new answer may not be kept
            return
        }
        let stored = CacheStoredResponse(
            status: status,
            fields: CacheStorability.storedFields(fields, modification: modification),
            requestFields: requestFields, requestTime: requestTime, responseTime: now,
            extraKeyFields: modification?.keyRequestHeaders ?? [])
        let fill = CacheFill(
            store: store, disk: disk, url: url, response: stored, contentLength: Int64(body.count),
            trustGeneration: trustGeneration)
        body.withUnsafeBytes { fill.append($0) }
        _ = fill.complete()
        Log.debug("cache: \(url) replaced in the background (\(status))")
    }
}

/// The final response's fields, handed from the `SideFetch`'s header sink to its completion.
///
/// Threading: the worker's thread.
private final class ReceivedFields {
    var fields: [(name: String, value: String)] = []
}

import CLibEvent
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// The shared cache's part of one exchange: what the lookup found and decided, the
/// validators a revalidation sends, the tee that stores the response, and the
/// `Cache-Status` parameters (RFC 9211) the response and the access log carry.
///
/// Threading: owned by its `Exchange`, on the worker's thread.
final class CacheExchange {
    let store: CacheStore
    /// The primary key: the request's effective URL.
    let url: String
    /// The request's fields, for Vary, the request directives and conditionals.
    let requestFields: [CacheFields.Field]
    let modification: CacheModification?
    /// The policy adds credentials or adapters: stored only as if the request had
    /// `Authorization` (RFC 9111 §3.5), since other clients would not send them.
    let policyAuthenticates: Bool
    /// Wall-clock seconds when the request was looked up (RFC 9111 `request_time`).
    let requestTime: Int64
    /// The `Cache-Status` parameters, e.g. `fwd=uri-miss; stored`.
    var parameters: String
    /// The stored response being validated, and the validators the try sends for it.
    var revalidating: CacheObject?
    var validators: [CacheLookup.Validator] = []
    /// The stored response as a `304` updated it (the client is answered from it).
    var validated: CacheObject?
    var fill: CacheFill?
    /// The disk tier's entry the lookup opened (its metadata decoded into a candidate): a hit,
    /// a stale answer or a `304`-validated answer streams its body from here.
    var diskReader: DiskCacheTier.Reader?
    /// This exchange's claim on fetching `url` (collapsed forwarding): other misses for it
    /// wait until it ends. Ended when the response is stored or found not storable, and at
    /// the latest when the exchange goes (deinit), whatever ended it.
    var fetchToken: UInt64?
    /// The request waited for another exchange's fetch before this lookup.
    var collapsed = false
    /// The request has a body: it is neither looked up nor stored (its key would be the
    /// body-less request's).
    var requestHasBody = false
    /// The policy followed a redirect: the responses that follow are another URL's, never
    /// stored under `url`.
    var redirected = false
    /// For an `https` URL, the trust generation (`PolicyTable.generation`) of this exchange's
    /// pipeline: recorded with what it stores; a stored entry with another one is validated.
    let trustGeneration: UInt64?

    func endFetch() {
        if let token = fetchToken { store.endFetch(url, token: token) }
        fetchToken = nil
    }

    deinit { endFetch() }

    init(
        store: CacheStore, url: String, requestFields: [CacheFields.Field], modification: CacheModification?,
        policyAuthenticates: Bool, requestTime: Int64, trustGeneration: UInt64?
    ) {
        self.trustGeneration = trustGeneration
        self.store = store
        self.url = url
        self.requestFields = requestFields
        self.modification = modification
        self.policyAuthenticates = policyAuthenticates
        self.requestTime = requestTime
        parameters = ""
    }

    /// The client's validators, replaced by the stored response's on a revalidation.
    static let validatorNames = ["if-none-match", "if-modified-since"]
    /// The fields a `304` from the cache carries (RFC 9110 §15.4.5).
    static let notModifiedFields: Set<String> = [
        "cache-control", "content-location", "date", "etag", "expires",
        "vary", "last-modified",
    ]
}

/// The shared cache in the exchange (docs/caching.md): a lookup before anything else of the
/// pipeline runs (a hit takes no upstream slot, no libcurl handle, no adapter), the response
/// head's storability, the tee, `304` revalidations, invalidation after unsafe methods.
/// The rules are `CacheLookup`, `CacheStorability`, `CacheFreshness`, `CacheInvalidation`
/// (SluiceCore); this is the glue that performs their decisions.
///
/// Threading: the worker's thread. With a disk tier (`worker.diskTier`) this thread also does
/// the tier's blocking file IO, in bounded units: a lookup that misses memory opens the URL's
/// entry (two small reads), a 304 rewrites its record, and a disk hit reads one verified block
/// (256 KiB `pread` + SHA-256) at a time, only while the client's output holds less than
/// `diskHitOutputBound` — the rest waits for `onWritable`, never for the client.
extension ClientConnection {
    static func wallClockSeconds() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Int64(ts.tv_sec)
    }

    /// Looks the request up; true when the cache answered it (a hit, or `504` for
    /// `only-if-cached`) or the request now waits for another exchange's fetch of the same
    /// URL (`mayWait`: collapsed forwarding). Only called with a `cache_store`, for a policy
    /// that caches.
    func answerFromCache(_ head: HTTPRequestHead, _ exchange: Exchange, _ store: CacheStore, mayWait: Bool) -> Bool {
        let policy = exchange.policy
        let fields = head.fields.map { (name: head.name($0), value: head.value($0)) }
        let cache = CacheExchange(
            store: store, url: exchange.target.url, requestFields: fields,
            modification: policy.cache.modification,
            policyAuthenticates: policy.credentials != nil || !policy.adapters.isEmpty,
            requestTime: Self.wallClockSeconds(),
            trustGeneration: exchange.target.scheme == .https ? exchange.pipeline.policies.generation : nil)
        cache.requestHasBody = head.hasBody
        exchange.cache = cache
        reportCache(.lookup(url: cache.url), exchange)
        let method = head.method
        let cacheable = method == "GET" || method == "HEAD"
        var candidates = cacheable && !head.hasBody ? store.memory.variants(for: cache.url) : []
        if candidates.isEmpty, cacheable, !head.hasBody, let disk = worker.diskTier {
            // An entry goes to one tier: the disk tier is looked at when memory has none. Its
            // trust generation is read on both sides of the open: a store that changed the
            // entry in between leaves none (the entry is then validated first).
            let before = store.diskTrustGeneration(cache.url)
            let reader = disk.open(key: cache.url)
            let generation = store.diskTrustGeneration(cache.url) == before ? before : nil
            if let reader, var response = CacheStoredResponse(bytes: reader.metadata) {
                response.bodyLength = Int64(reader.bodyLength)
                candidates = [CacheObject(response: response, diskLength: Int(reader.bodyLength), trustGeneration: generation)]
                cache.diskReader = reader
            } else if reader != nil {
                disk.remove(key: cache.url)  // metadata of another version: dropped
            }
        }
        // An https entry from another trust generation (or a disk entry with none recorded in
        // this process: `CacheStore.recordDiskTrust`) is validated first.
        var outdated = Set<Int>()
        if let generation = cache.trustGeneration {
            for (i, c) in candidates.enumerated() where c.trustGeneration != generation { outdated.insert(i) }
        }
        var decision =
            cacheable && head.hasBody
            ? .forward(.bypass)
            : CacheLookup.decide(
                method: method, requestFields: fields, candidates: candidates.map(\.response),
                now: cache.requestTime, modification: cache.modification, outdated: outdated)
        if case .serveStale(let hit, let validators) = decision, cache.policyAuthenticates {
            // A background request would go without the policy's credentials and adapters:
            // this one revalidates, blocking, through the pipeline instead.
            decision = .revalidate(variant: hit.variant, conditional: validators, reason: .stale)
        }
        switch decision {
        case .serve(let hit):
            let object = candidates[hit.variant]
            // docs/trust.md: an answer for an https URL under `insecure` trust says so in the log.
            if cache.trustGeneration != nil, policy.trust.requirements.insecure { exchange.summary.insecure = true }
            reportCache(.hit(age: hit.age, notModified: hit.notModified), exchange)
            serveStored(
                object, head, exchange,
                parameters: "hit; ttl=\(hit.ttl)" + (object.onDisk ? "; detail=disk" : "") + (mayWait ? "" : "; collapsed"),
                age: hit.age, notModified: hit.notModified)
            return true
        case .serveStale(let hit, let validators):
            // stale-while-revalidate: answered now; one background revalidation per URL.
            let object = candidates[hit.variant]
            if circuitAllowsBackgroundFetch(exchange), let token = store.beginFetch(cache.url) {
                CacheRevalidation.start(
                    object, url: cache.url, token: token, validators: validators,
                    requestFields: fields, hostHeader: exchange.hostHeader?.value,
                    modification: cache.modification, store: store, worker: worker)
            }
            reportCache(.hit(age: hit.age, notModified: hit.notModified), exchange)
            serveStored(
                object, head, exchange, parameters: "hit; fwd=stale; ttl=\(hit.ttl); detail=stale-while-revalidate",
                age: hit.age, notModified: hit.notModified)
            return true
        case .onlyIfCachedMiss:
            cache.parameters = "fwd=miss"
            exchange.summary.cache = "fwd=miss; only-if-cached"
            reportCache(.miss(reason: "only-if-cached"), exchange)
            respondError(.onlyIfCachedMiss)
            return true
        case .forward(let reason):
            cache.parameters = "fwd=\(reason.rawValue)"
            if reason == .uriMiss || reason == .varyMiss, method == "GET", CacheFields.value("range", in: fields) == nil {
                // Collapsed forwarding: one miss per URL fetches; the others wait for it.
                if let token = store.beginFetch(cache.url) {
                    cache.fetchToken = token
                } else if mayWait {
                    exchange.cache = nil
                    state = .awaitingCollapsed(since: MonotonicClock.milliseconds())
                    armTimer(.collapsed)
                    return true
                }
            }
            if !mayWait { cache.parameters += "; collapsed" }
            reportCache(.miss(reason: reason.rawValue), exchange)
        case .revalidate(let variant, let validators, let reason):
            cache.parameters = "fwd=\(reason.rawValue)"
            cache.revalidating = candidates[variant]
            cache.validators = validators
            reportCache(.miss(reason: reason.rawValue), exchange)
        }
        exchange.summary.cache = cache.parameters
        return false
    }

    /// A background revalidation is not sent to an origin whose circuit (`health`) is not
    /// closed: it would neither be admitted as a trial nor tell the breaker anything.
    func circuitAllowsBackgroundFetch(_ exchange: Exchange) -> Bool {
        guard exchange.policy.health != nil else { return true }
        let target = exchange.target
        let origin = UpstreamHealth.Origin(
            scheme: target.scheme == .https ? "https" : "http", host: target.host, port: target.port)
        return (worker.health.state(of: origin) ?? .closed) == .closed
    }

    /// A waiting miss looks again: the fetch it waited for ended (or the wait ran out), so the
    /// lookup may hit now; otherwise the request goes to the origin itself.
    func collapsedWaitTick() {
        guard case .awaitingCollapsed(let since) = state, let head = currentHead, let exchange,
            let store = worker.cacheStore
        else { return }
        if store.isFetching(exchange.target.url),
            MonotonicClock.milliseconds() - since < CacheStore.collapsedWaitMilliseconds
        {
            armTimer(.collapsed)
            return
        }
        state = .awaitingHead
        if answerFromCache(head, exchange, store, mayWait: false) { return }
        prepareWhenAdmitted(head, exchange)
    }

    /// A revalidation's try sends the stored response's validators instead of the client's.
    func applyCacheValidators(_ request: inout UpstreamRequest, _ exchange: Exchange) {
        guard let cache = exchange.cache, cache.revalidating != nil, request.target.url == cache.url else { return }
        request.headers = request.headers.replacing(
            CacheExchange.validatorNames,
            adding: cache.validators.map { ($0.name, $0.value) })
    }

    /// Decides what the cache does with a final response head about to be forwarded: a `304`
    /// that validated the stored response is absorbed (true: the transfer was told); a
    /// storable response gets a tee; an unsafe method's success invalidates. Sets the
    /// `Cache-Status` line the forwarded head carries.
    func cacheResponseHead(
        _ response: UpstreamResponseHead, _ transfer: any UpstreamTransfer, _ exchange: Exchange,
        _ cache: CacheExchange
    ) -> Bool {
        let now = Self.wallClockSeconds()
        let status = response.status
        let fields = response.collected.endToEndFields()
        let method = exchange.summary.method
        var requestFields = cache.requestFields
        if cache.policyAuthenticates { requestFields.append(("Authorization", "")) }
        if cache.redirected {
            // A redirect was followed: this is another URL's response, not stored under this one.
            if cache.revalidating != nil {
                cache.store.memory.invalidate(cache.url)
                worker.diskTier?.remove(key: cache.url)
            }
            cache.endFetch()
            exchange.summary.cache = cache.parameters
            transfer.extraHeadLines = Array("Cache-Status: Sluice; \(cache.parameters)\r\n".utf8)
            return false
        }
        if !CacheInvalidation.safeMethods.contains(method) {
            var dropped = 0
            for url in CacheInvalidation.targets(
                method: method, status: status, url: cache.url,
                location: response.value("location"),
                contentLocation: response.value("content-location"))
            {
                dropped += cache.store.memory.invalidate(url)
                worker.diskTier?.remove(key: url)
            }
            if dropped > 0 { reportCache(.invalidated(count: dropped), exchange) }
        } else if let stale = cache.revalidating {
            reportCache(.revalidated(status: status), exchange)
            if CacheLookup.errorStatuses.contains(status),
                CacheLookup.mayServeStaleOnError(
                    stale.response, requestFields: cache.requestFields, now: now,
                    modification: cache.modification)
            {
                // stale-if-error: the client gets the stored response instead of the origin's error.
                cache.validated = stale
                cache.parameters += "; fwd-status=\(status)"
                exchange.summary.cache = cache.parameters
                transfer.absorb()
                return true
            }
            if status == 304 {
                // The client gets every field of the 304 (its Set-Cookie too); the stored copy
                // keeps only what may be stored, or goes when the merge may not be stored.
                if let kept = CacheStorability.afterNotModified(
                    stale.response, notModified: fields,
                    requestFields: requestFields,
                    modification: cache.modification,
                    requestTime: cache.requestTime, responseTime: now)
                {
                    let updated = stale.withResponse(kept, trustGeneration: cache.trustGeneration)
                    if updated.onDisk {
                        cache.store.recordDiskTrust(cache.url, generation: nil)  // none while it changes
                        if worker.diskTier?.updateMetadata(key: cache.url, updated.response.encode()) == true {
                            cache.store.recordDiskTrust(cache.url, generation: cache.trustGeneration)
                        }
                    } else if let evicted = cache.store.memory.insert(updated, for: cache.url), evicted > 0 {
                        reportCache(.evicted(count: evicted), exchange)
                    }
                } else {
                    cache.store.memory.invalidate(cache.url)
                    worker.diskTier?.remove(key: cache.url)
                }
                cache.validated = stale.withResponse(
                    stale.response.updated(
                        with: fields, requestTime: cache.requestTime,
                        responseTime: now),
                    trustGeneration: cache.trustGeneration)
                cache.parameters += "; fwd-status=304"
                exchange.summary.cache = cache.parameters
                transfer.absorb()
                return true
            }
        }
        // The framing the encoder uses: a Content-Length beside Transfer-Encoding says nothing.
        let contentLength =
            response.value("transfer-encoding") != nil
            ? nil
            : response.value("content-length").flatMap { Int64($0) }
        let decision = CacheStorability.decide(
            method: method, requestFields: requestFields, status: status,
            responseFields: fields, modification: cache.modification,
            contentLength: contentLength, maxObjectSize: cache.store.maxObjectSize,
            requestHasBody: cache.requestHasBody)
        if decision == .store {
            let stored = CacheStoredResponse(
                status: status,
                fields: CacheStorability.storedFields(fields, modification: cache.modification),
                requestFields: cache.requestFields, requestTime: cache.requestTime,
                responseTime: now, extraKeyFields: cache.modification?.keyRequestHeaders ?? [])
            let fill = CacheFill(
                store: cache.store, disk: worker.diskTier, url: cache.url, response: stored,
                contentLength: contentLength, trustGeneration: cache.trustGeneration)
            transfer.cacheFill = fill
            cache.fill = fill
            cache.parameters += "; stored"
        } else {
            if cache.revalidating != nil, method == "GET", status != 206 {
                cache.store.memory.invalidate(cache.url)  // the origin's new answer may not be kept
                worker.diskTier?.remove(key: cache.url)
            }
            cache.endFetch()  // nothing will be stored: the waiting requests go to the origin
        }
        exchange.summary.cache = cache.parameters
        transfer.extraHeadLines = Array("Cache-Status: Sluice; \(cache.parameters)\r\n".utf8)
        return false
    }

    /// A revalidation failed before a response (no connection, a timeout): the stored response
    /// answers when `stale-if-error` allows it; when the origin's circuit is open, whenever
    /// RFC 9111 §4.2.4's disconnected rules allow it (`CacheLookup.mayServeWhileDisconnected`).
    /// True when it did.
    func serveStaleOnError(_ error: ProxyError, _ exchange: Exchange) -> Bool {
        guard let cache = exchange.cache, let stale = cache.revalidating, let head = currentHead,
            CacheLookup.errorStatuses.contains(error.status)
        else { return false }
        switch error {
        case .trustFailure, .tlsFailure: return false  // a stored copy never papers over refused trust
        default: break
        }
        // An https entry stored under trust a reload replaced answers only once validated.
        guard stale.trustGeneration == cache.trustGeneration else { return false }
        let now = Self.wallClockSeconds()
        var parameters = cache.parameters + "; fwd-status=\(error.status)"
        if case .upstreamCircuitOpen = error {
            // The origin's circuit is open: no request was sent, the cache is disconnected
            // from it (RFC 9111 §4.2.4), so stale is served unless forbidden.
            guard
                CacheLookup.mayServeWhileDisconnected(
                    stale.response, requestFields: cache.requestFields, now: now,
                    modification: cache.modification)
            else { return false }
            parameters += "; detail=circuit-open"
        } else {
            guard
                CacheLookup.mayServeStaleOnError(
                    stale.response, requestFields: cache.requestFields, now: now,
                    modification: cache.modification)
            else { return false }
        }
        state = .awaitingHead
        reportCache(.revalidated(status: error.status), exchange)
        exchange.summary.error = error.message
        let age = CacheFreshness.currentAge(of: stale.response, now: now)
        serveStored(
            stale, head, exchange, parameters: parameters, age: age,
            notModified: CacheConditional.notModified(cache.requestFields, stored: stale.response))
        return true
    }

    /// The response ended whole: the tee's object is published.
    func cacheResponseFinished(_ exchange: Exchange) {
        guard let cache = exchange.cache, let fill = cache.fill else { return }
        cache.fill = nil
        defer { cache.endFetch() }  // after the object is in the store: the waiting requests hit
        guard let evicted = fill.complete() else { return }
        reportCache(.stored(bytes: fill.total), exchange)
        if evicted > 0 { reportCache(.evicted(count: evicted), exchange) }
    }

    /// A `304` validated the stored response: the client is answered from its update.
    func transferAbsorbed() {
        state = .awaitingHead
        guard let exchange, let cache = exchange.cache, let object = cache.validated, let head = currentHead else {
            return respondError(.upstreamProtocol(host: exchange?.target.authority ?? "", reason: "unexpected 304"))
        }
        let now = Self.wallClockSeconds()
        let age = CacheFreshness.currentAge(of: object.response, now: now)
        let notModified = CacheConditional.notModified(cache.requestFields, stored: object.response)
        serveStored(object, head, exchange, parameters: cache.parameters, age: age, notModified: notModified)
    }

    /// Writes a stored response (or `304` for the client's matching conditional, `206`/`416`
    /// for a `Range`) and ends the exchange: head, `Via`, `Age`, `Cache-Status`,
    /// `Content-Length`, then the body chunks. A small chunk is copied; a large one is added
    /// by reference: the chunk is retained (`passRetained`) for libevent, and the cleanup
    /// callback, which libevent calls exactly once when those bytes are drained or the
    /// buffer is freed (on this worker's thread), releases it — so the bytes outlive an
    /// eviction or a revalidation that drops the object meanwhile.
    func serveStored(
        _ object: CacheObject, _ head: HTTPRequestHead, _ exchange: Exchange, parameters: String,
        age: Int64, notModified: Bool
    ) {
        let isHead = head.methodIs("HEAD")
        var range = CacheRange.full
        if !notModified, !isHead, object.response.status == 200,
            let value = exchange.cache.flatMap({ CacheFields.value("range", in: $0.requestFields) })
        {
            range = CacheRange.evaluate(value, length: Int64(object.bodyLength))
        }
        let status: Int
        var bodyRange = 0..<object.bodyLength
        var contentRange: String?
        switch range {
        case _ where notModified: status = 304
        case .full: status = object.response.status
        case .partial(let first, let last):
            status = 206
            bodyRange = Int(first)..<Int(last + 1)
            contentRange = "bytes \(first)-\(last)/\(object.bodyLength)"
        case .unsatisfiable:
            status = 416
            bodyRange = 0..<0
            contentRange = "bytes */\(object.bodyLength)"
        }
        let bodiless = notModified || status == 204 || status < 200
        let metadataOnly = notModified || status == 416
        let output = clientOutput
        var statusLine = "HTTP/1.1 \(status) \(ResponseEncoder.reasonPhrase(status))\r\n"
        statusLine.withUTF8 { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
        if metadataOnly {
            var text = ""
            for field in object.response.fields where CacheExchange.notModifiedFields.contains(field.name.lowercased()) {
                text += field.name + ": " + field.value + "\r\n"
            }
            text.withUTF8 { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
        } else {
            object.fieldLines.withUnsafeBytes { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
        }
        var text = "Age: \(age)\r\n"
        if let contentRange { text += "Content-Range: \(contentRange)\r\n" }
        worker.viaLine.withUnsafeBytes { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
        text += "Cache-Status: Sluice; \(parameters)\r\n"
        if !bodiless { text += "Content-Length: \(bodyRange.count)\r\n" }
        let keepAlive = keepsAliveAfterResponse
        if !keepAlive { text += "Connection: close\r\n" }
        text += "\r\n"
        text.withUTF8 { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
        var sent = 0
        if object.onDisk, !bodiless, !isHead, !bodyRange.isEmpty {
            // The body streams from the disk tier as the client drains (`pumpDiskHit`).
            let reader = exchange.cache?.diskReader ?? worker.diskTier?.open(key: exchange.target.url)
            exchange.cache?.diskReader = nil
            exchange.summary.cache = parameters
            exchange.report(exchange.machine.handle(.responseHeadSent(status: status)))
            guard let reader, UInt64(object.bodyLength) == reader.bodyLength else {
                return abortDiskHit(exchange, reason: "disk cache entry vanished")
            }
            let hit = DiskHitStream(reader: reader, exchange: exchange, range: bodyRange, keepAlive: keepAlive)
            state = .servingDisk(hit)
            return pumpDiskHit(hit)
        }
        if !bodiless && !isHead {
            var offset = 0
            for chunk in object.chunks {
                defer { offset += chunk.count }
                // The part of this chunk inside the range (all of it without a Range).
                let from = max(bodyRange.lowerBound, offset)
                let to = min(bodyRange.upperBound, offset + chunk.count)
                guard from < to else { continue }
                let start = chunk.bytes.baseAddress! + (from - offset)
                let count = to - from
                if count >= Self.referenceThreshold {
                    let retained = Unmanaged.passRetained(chunk).toOpaque()
                    evbuffer_add_reference(
                        output, start, count,
                        { _, _, extra in
                            Unmanaged<CacheChunk>.fromOpaque(extra!).release()
                        }, retained)
                } else {
                    evbuffer_add(output, start, count)
                }
                sent += count
            }
        }
        scheduleFlush()
        exchange.summary.cache = parameters
        exchange.report(exchange.machine.handle(.responseHeadSent(status: status)))
        _ = exchange.machine.handle(.responseBodySent(bytes: sent))
        exchange.end(.ok)
        if keepAlive { exchangeEnded() } else { closeAfterFlush() }
    }

    /// A disk hit reads its next block only while the client's output holds less than this
    /// (1 MiB): a slow client holds at most this plus one block in memory, and the loop never
    /// waits for it.
    static let diskHitOutputBound = 1 << 20

    /// Sends the disk hit's next blocks while the client's output is below
    /// `diskHitOutputBound` (each block is read and verified on this thread: one `pread` of
    /// `blockSize` plus its SHA-256), and ends the exchange after the last. Called when the
    /// head is written and whenever the output drains (`onWritable`).
    func pumpDiskHit(_ hit: DiskHitStream) {
        let output = clientOutput
        while hit.offset < hit.range.upperBound, evbuffer_get_length(output) < Self.diskHitOutputBound {
            let start = hit.offset
            let range = hit.range
            let read: Int?
            do {
                read = try hit.reader.withNextBlock { bytes -> Int in
                    let from = max(range.lowerBound, start)
                    let to = min(range.upperBound, start + bytes.count)
                    if from < to { evbuffer_add(output, bytes.baseAddress! + (from - start), to - from) }
                    return bytes.count
                }
            } catch {
                return abortDiskHit(hit.exchange, reason: "disk cache entry corrupt at block \(error.block)")
            }
            guard let read, read > 0 else { return abortDiskHit(hit.exchange, reason: "disk cache entry ended early") }
            hit.sent += min(range.upperBound, start + read) - max(range.lowerBound, start)
            hit.offset += read
        }
        scheduleFlush()
        guard hit.offset >= hit.range.upperBound else { return }
        let exchange = hit.exchange
        _ = exchange.machine.handle(.responseBodySent(bytes: hit.sent))
        exchange.end(.ok)
        if hit.keepAlive { exchangeEnded() } else { closeAfterFlush() }
    }

    /// A disk hit's body cannot be completed (a block failed its digest; the entry was
    /// dropped): the response already announced its length, so the connection is closed
    /// without completing it, and the access log says why.
    func abortDiskHit(_ exchange: Exchange, reason: String) {
        Log.warning("\(reason): \(exchange.target.url); response to \(peer) aborted")
        exchange.end(.error, error: reason + "; response aborted")
        abortiveClose = true
        close()
    }

    /// Chunks at least this large (16 KiB) are written by reference, smaller ones copied.
    static let referenceThreshold = 16 << 10

    func reportCache(_ event: CacheEvent, _ exchange: Exchange) {
        guard let monitor = exchange.monitor, monitor.events.contains(.cache) else { return }
        monitor.handle(.cache(id: exchange.id, event: event))
    }
}

/// A stored response whose body streams from the disk tier to one client: the entry's open
/// reader (the entry may be evicted or replaced meanwhile; the reader keeps its file), the
/// byte range sent, and how far it got.
///
/// Threading: owned by its `ClientConnection` (its `.servingDisk` state) on the worker's
/// thread; the reader's descriptor is closed when the stream goes.
final class DiskHitStream {
    let reader: DiskCacheTier.Reader
    let exchange: Exchange
    let range: Range<Int>
    let keepAlive: Bool
    /// The body offset of the next block to read.
    var offset: Int
    var sent = 0

    init(reader: DiskCacheTier.Reader, exchange: Exchange, range: Range<Int>, keepAlive: Bool) {
        self.reader = reader
        self.exchange = exchange
        self.range = range
        self.keepAlive = keepAlive
        offset = Int(reader.seek(toBlockContaining: UInt64(range.lowerBound)))
    }
}

import SluiceCore

/// The shared cache's lookup (`cache`, `cache_store`; docs/caching.md): before the upstream
/// slot, the adapters and any try, a stored response may answer (a hit takes no upstream
/// slot, no transfer, no adapter), a miss may wait for another exchange fetching the same URL
/// (collapsed forwarding), and a stale one is revalidated by the try. On the response's way
/// back it decides what is kept: a storable response gets a tee (`CacheFill`), a `304`
/// validates the stored one, an unsafe method invalidates, a failed revalidation may answer
/// stale. The rules are `CacheLookup`, `CacheStorability`, `CacheFreshness` and
/// `CacheInvalidation` (SluiceCore); `StoredResponseWriter` writes the answers. With a disk
/// tier this thread does the tier's bounded file IO: a lookup that misses memory opens the
/// URL's entry (two small reads, or none for a record the tier keeps), a `304` rewrites its
/// record. With `fleet.cache`, a URL another member owns is asked of it before this instance's
/// store is looked up (`PeerHop`).
enum CacheStage: RequestStage, ResponseStage {
    static var name: String { "cache" }

    static func enter(_ exchange: Exchange, _ services: any StageServices) -> StageVerdict {
        // An upgrade handshake (WebSocket) is never answered from, or stored in, the cache.
        guard let store = services.cacheStore, exchange.policy.cache.caches, exchange.upgrade == nil else {
            return .proceed
        }
        return Self.lookUp(exchange, store, services)
    }

    /// With `fleet.cache`, a URL another member owns goes to the members ranked above this
    /// instance first (`peerWalk`), without a lookup here. Otherwise looks the request up: a
    /// stored response answers (a hit, stale-while-revalidate), `504` for `only-if-cached`, a
    /// wait for another exchange's fetch of the same URL (collapsed forwarding; once: a request
    /// that waited goes to the origin itself on its next miss), or the request goes on, with
    /// what a revalidation needs in `exchange.cache`.
    static func lookUp(_ exchange: Exchange, _ store: CacheStore, _ services: any StageServices) -> StageVerdict {
        let head = exchange.head
        let method = head.method
        let cacheable = method == "GET" || method == "HEAD"
        if let walk = peerWalk(exchange, services, cacheable: cacheable) {
            // Another member owns the URL: its copy is the fleet's one. This instance's store is
            // not looked up, so a copy it kept from a time it owned the URL is not served (it
            // ages out, or answers again once this instance owns the URL or the walk reaches it).
            exchange.summary.cache = PeerHop.parameters
            return .wait(.peers(walk))
        }
        let mayWait = exchange.collapsedSince == nil
        let policy = exchange.policy
        let fields = head.fields.map { (name: head.name($0), value: head.value($0)) }
        let cache = CacheExchange(
            store: store, url: exchange.target.url, requestFields: fields,
            modification: policy.cache.modification,
            policyAuthenticates: policy.credentials != nil || !policy.adapters.isEmpty,
            requestTime: wallClockSeconds(),
            trustGeneration: exchange.target.scheme == .https ? exchange.pipeline.policies.generation : nil)
        cache.requestHasBody = head.hasBody
        exchange.cache = cache
        exchange.reportCache(.lookup(url: cache.url))
        var candidates = cacheable && !head.hasBody ? store.memory.variants(for: cache.url) : []
        var decision = decide(cache, method: method, fields: fields, hasBody: head.hasBody, candidates: candidates)
        if cacheable, !head.hasBody, let disk = services.diskTier, decision.missesTheStore {
            // The disk tier is the store, memory its hot layer: what memory lacks (an entry
            // evicted from it, stored before a restart, or another variant) is looked up there.
            // A promotion's registration comes before the open (see `CachePromotion`).
            cache.promotionToken = store.memory.beginFill(cache.url, promotion: true)
            let (found, readers) = diskCandidates(cache, store, disk)
            if !found.isEmpty {
                candidates = found
                decision = Self.decide(cache, method: method, fields: fields, hasBody: false, candidates: candidates)
                if let variant = decision.variant {
                    cache.diskReader = readers[variant]
                    disk.touch(readers[variant].name)
                }
            }
        }
        if case .serveStale(let hit, let validators) = decision, cache.policyAuthenticates {
            // A background request would go without the policy's credentials and adapters:
            // this one revalidates, blocking, through the pipeline instead.
            decision = .revalidate(variant: hit.variant, conditional: validators, reason: .stale)
        }
        switch decision {
        case .serve(let hit):
            let object = candidates[hit.variant]
            // A memory hit keeps its disk entry recently used: the disk is the store.
            if !object.onDisk, let entry = object.diskEntry { services.diskTier?.touch(entry.name) }
            // docs/trust.md: an answer for an https URL under `insecure` trust says so in the log.
            if cache.trustGeneration != nil, policy.trust.requirements.insecure { exchange.summary.insecure = true }
            exchange.reportCache(.hit(age: hit.age, notModified: hit.notModified))
            return .serveStored(
                StoredAnswer(
                    object: object,
                    parameters: "hit; ttl=\(hit.ttl)"
                        + (object.onDisk ? "; detail=disk" : services.diskTier != nil ? "; detail=memory" : "")
                        + (mayWait ? "" : "; collapsed"),
                    age: hit.age, notModified: hit.notModified))
        case .serveStale(let hit, let validators):
            // stale-while-revalidate: answered now; one background revalidation per URL.
            let object = candidates[hit.variant]
            if let token = store.beginFetch(cache.url) {
                if let admitted = BackgroundTry.admit(exchange, services) {
                    services.revalidateInBackground(
                        object, cache, token: token, validators: validators, hostHeader: exchange.hostHeader?.value,
                        as: admitted)
                } else {
                    store.endFetch(cache.url, token: token)
                }
            }
            exchange.reportCache(.hit(age: hit.age, notModified: hit.notModified))
            return .serveStored(
                StoredAnswer(
                    object: object, parameters: "hit; fwd=stale; ttl=\(hit.ttl); detail=stale-while-revalidate",
                    age: hit.age, notModified: hit.notModified))
        case .onlyIfCachedMiss:
            cache.parameters = "fwd=miss"
            exchange.summary.cache = "fwd=miss; only-if-cached"
            exchange.reportCache(.miss(reason: "only-if-cached"))
            return .respond(.onlyIfCachedMiss)
        case .forward(let reason):
            cache.parameters = "fwd=\(reason.rawValue)"
            if reason == .uriMiss || reason == .varyMiss, method == "GET", CacheFields.value("range", in: fields) == nil {
                // Collapsed forwarding: one miss per URL fetches; the others wait for it, and
                // read its response as it is stored (shared fills).
                let (claimed, fetch) = store.claimFetch(cache.url)
                if claimed {
                    cache.fetch = fetch
                } else if mayWait {
                    exchange.cache = nil
                    exchange.collapsedSince = MonotonicClock.milliseconds()
                    return .wait(.collapsedFetch(fetch))
                }
            }
            if !mayWait { cache.parameters += "; collapsed" }
            exchange.reportCache(.miss(reason: reason.rawValue))
        case .revalidate(let variant, let validators, let reason):
            cache.parameters = "fwd=\(reason.rawValue)"
            cache.revalidating = candidates[variant]
            cache.validators = validators
            exchange.reportCache(.miss(reason: reason.rawValue))
        }
        exchange.summary.cache = cache.parameters
        return .proceed
    }

    /// The members to ask before this instance looks the request up in its own store
    /// (`fleet.cache`; docs/fleet.md, "One cache across the fleet"): those ranked above it for
    /// the URL — the cache's primary key, so that every variant of a URL has one owner. Nil
    /// (look up here, as without a fleet) for a request that came from a peer (never passed on
    /// to a third), one whose peers were asked already and did not answer, a method or body the
    /// cache does not look up, or a URL this instance owns. Without `fleet.cache` it costs one
    /// nil check.
    static func peerWalk(_ exchange: Exchange, _ services: any StageServices, cacheable: Bool) -> PeerWalk? {
        guard let peers = services.peers, cacheable, !exchange.head.hasBody, !exchange.fromPeer, !exchange.peersAsked
        else { return nil }
        let walk = PeerWalk(ranking: peers.owners.ranked(exchange.target.url), this: peers.settings.advertise)
        return walk.isEmpty ? nil : walk
    }

    /// `CacheLookup.decide` over `candidates`. An https entry from another trust generation
    /// (or a disk entry with none recorded in this process: `CacheStore.recordDiskTrust`) is
    /// validated first.
    static func decide(
        _ cache: CacheExchange, method: String, fields: [CacheFields.Field], hasBody: Bool, candidates: [CacheObject]
    ) -> CacheLookup.Decision {
        if (method == "GET" || method == "HEAD") && hasBody { return .forward(.bypass) }
        var outdated = Set<Int>()
        if let generation = cache.trustGeneration {
            for (i, c) in candidates.enumerated() where c.trustGeneration != generation { outdated.insert(i) }
        }
        return CacheLookup.decide(
            method: method, requestFields: fields, candidates: candidates.map(\.response),
            now: cache.requestTime, modification: cache.modification, outdated: outdated)
    }

    /// The disk tier's entries for the URL, every variant (at most `DiskCacheTier.maxVariants`),
    /// each with the reader its lookup opened (two small reads per variant, none for a record the
    /// tier keeps). Each entry's trust
    /// generation is read on both sides of its open: a store that changed the entry in between
    /// leaves none (the entry is then validated first). An entry whose stored head this
    /// version cannot decode is dropped; a decoded head's object is kept with the tier's record
    /// (`DiskDecodedRecords`) and not made again while the record file is unchanged.
    static func diskCandidates(
        _ cache: CacheExchange, _ store: CacheStore, _ disk: DiskCacheTier
    ) -> ([CacheObject], [DiskCacheTier.Reader]) {
        var objects: [CacheObject] = []
        var readers: [DiskCacheTier.Reader] = []
        for variant in disk.variants(of: cache.url).prefix(DiskCacheTier.maxVariants) {
            let key = DiskCacheTier.entryKey(cache.url, variant: variant)
            let before = store.diskTrustGeneration(key)
            guard let reader = disk.open(key: cache.url, variant: variant, touch: false) else { continue }
            let generation = store.diskTrustGeneration(key) == before ? before : nil
            let entry = CacheObject.DiskEntry(name: reader.name, generation: reader.generation)
            let object: CacheObject
            if let kept = reader.decoded as? CacheObject, kept.diskEntry == entry {
                object = kept  // the record is unchanged since this process decoded its head
            } else if let response = CacheStoredResponse(bytes: reader.metadata) {
                object = CacheObject(response: response, diskLength: Int(reader.bodyLength), diskEntry: entry)
                reader.attachDecoded(object)
            } else {
                disk.remove(key: cache.url, variant: variant)
                continue
            }
            objects.append(object.withTrustGeneration(generation))
            readers.append(reader)
        }
        return (objects, readers)
    }

    /// A revalidation's try sends the stored response's validators instead of the client's.
    static func applyValidators(_ request: inout UpstreamRequest, _ exchange: Exchange) {
        guard let cache = exchange.cache, cache.revalidating != nil, request.target.url == cache.url else { return }
        request.headers = request.headers.replacing(
            CacheExchange.validatorNames,
            adding: cache.validators.map { ($0.name, $0.value) })
    }

    // MARK: the response's way back

    static func head(
        _ response: inout ResponseHeadContext, _ exchange: Exchange, _ services: any StageServices
    )
        -> ResponseVerdict
    {
        guard let cache = exchange.cache else { return .proceed }
        return responseHead(response.response, response.transfer, exchange, cache, services) ? .handled : .proceed
    }

    static func end(_ ending: TryEnding, _ exchange: Exchange, _ services: any StageServices) {
        if case .complete = ending { responseFinished(exchange) }
    }

    /// After a `304` this stage absorbed (`error` nil): the stored response's update. Instead
    /// of Sluice's `error` while a stored response was being revalidated: that response, when
    /// `stale-if-error` (or an open circuit) allows it.
    static func storedAnswer(replacing error: ProxyError?, _ exchange: Exchange) -> StoredAnswer? {
        guard let error else { return validatedAnswer(exchange) }
        return exchange.cache?.revalidating == nil ? nil : staleAnswer(on: error, exchange)
    }

    /// Decides what the cache does with a final response head about to be forwarded: a `304`
    /// that validated the stored response is absorbed (true: the transfer was told); a
    /// storable response gets a tee; an unsafe method's success invalidates. Sets the
    /// `Cache-Status` line the forwarded head carries.
    static func responseHead(
        _ response: UpstreamResponseHead, _ transfer: any UpstreamTransfer, _ exchange: Exchange,
        _ cache: CacheExchange, _ services: any StageServices
    ) -> Bool {
        let now = wallClockSeconds()
        let status = response.status
        let fields = response.collected.endToEndFields()
        let method = exchange.summary.method
        var requestFields = cache.requestFields
        if cache.policyAuthenticates { requestFields.append(("Authorization", "")) }
        if cache.redirected {
            // A redirect was followed: this is another URL's response, not stored under this one.
            if cache.revalidating != nil {
                services.diskTier?.remove(key: cache.url)
                cache.store.memory.invalidate(cache.url)
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
                services.diskTier?.remove(key: url)
                dropped += cache.store.memory.invalidate(url)
            }
            if dropped > 0 { exchange.reportCache(.invalidated(count: dropped)) }
        } else if let stale = cache.revalidating {
            // Counted only when the try was conditional: a stored response without validators
            // (`fwd=stale` refetched whole) was not validated.
            if !cache.validators.isEmpty { exchange.reportCache(.revalidated(status: status)) }
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
                    if let evicted = storeValidated(updated, url: cache.url, store: cache.store, disk: services.diskTier),
                        evicted > 0
                    {
                        exchange.reportCache(.evicted(count: evicted))
                    }
                } else {
                    services.diskTier?.remove(key: cache.url)
                    cache.store.memory.invalidate(cache.url)
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
                store: cache.store, disk: services.diskTier, url: cache.url, response: stored,
                contentLength: contentLength, trustGeneration: cache.trustGeneration, fetch: cache.fetch)
            transfer.cacheFill = fill
            cache.fill = fill
            cache.parameters += "; stored"
        } else {
            if cache.revalidating != nil, method == "GET", status != 206 {
                services.diskTier?.remove(key: cache.url)
                cache.store.memory.invalidate(cache.url)  // the origin's new answer may not be kept
            }
            cache.endFetch()  // nothing will be stored: the waiting requests go to the origin
        }
        exchange.summary.cache = cache.parameters
        transfer.extraHeadLines = Array("Cache-Status: Sluice; \(cache.parameters)\r\n".utf8)
        return false
    }

    /// Stores a response a `304` validated: its new head goes to the disk entry (rewritten in
    /// place, crash-safe) and, for a memory object, to the memory tier. The disk entry has no
    /// trust record while it changes (a lookup in between validates), then `updated`'s.
    /// Returns the memory tier's evictions (nil when nothing went to memory).
    static func storeValidated(_ updated: CacheObject, url: String, store: CacheStore, disk: DiskCacheTier?) -> Int? {
        if let disk, let entry = updated.diskEntry {
            // Only the body that was validated gets the new head (not a newer one stored since).
            let variant = updated.response.varyKey
            let key = DiskCacheTier.entryKey(url, variant: variant)
            store.recordDiskTrust(key, generation: nil)
            if disk.updateMetadata(
                key: url, variant: variant, expectedGeneration: entry.generation, updated.response.encode())
            {
                store.recordDiskTrust(key, generation: updated.trustGeneration)
            }
        }
        return updated.onDisk ? nil : store.memory.insert(updated, for: url)
    }

    /// A revalidation failed before a response (no connection, a timeout): the stored response
    /// answers when `stale-if-error` allows it; when the origin's circuit is open, whenever
    /// RFC 9111 §4.2.4's disconnected rules allow it (`CacheLookup.mayServeWhileDisconnected`).
    /// Returns that answer, or nil.
    static func staleAnswer(on error: ProxyError, _ exchange: Exchange) -> StoredAnswer? {
        guard let cache = exchange.cache, let stale = cache.revalidating,
            CacheLookup.errorStatuses.contains(error.status)
        else { return nil }
        switch error {
        case .trustFailure, .tlsFailure: return nil  // a stored copy never papers over refused trust
        case .luaResponded: return nil  // a script's own answer is no error
        default: break
        }
        // An https entry stored under trust a reload replaced answers only once validated.
        guard stale.trustGeneration == cache.trustGeneration else { return nil }
        let now = wallClockSeconds()
        var parameters = cache.parameters + "; fwd-status=\(error.status)"
        if case .upstreamCircuitOpen = error {
            // The origin's circuit is open: no request was sent, the cache is disconnected
            // from it (RFC 9111 §4.2.4), so stale is served unless forbidden.
            guard
                CacheLookup.mayServeWhileDisconnected(
                    stale.response, requestFields: cache.requestFields, now: now,
                    modification: cache.modification)
            else { return nil }
            parameters += "; detail=circuit-open"
        } else {
            guard
                CacheLookup.mayServeStaleOnError(
                    stale.response, requestFields: cache.requestFields, now: now,
                    modification: cache.modification)
            else { return nil }
        }
        // No answer came from the origin: nothing was validated (the lookup counted a miss).
        exchange.summary.error = error.message
        let age = CacheFreshness.currentAge(of: stale.response, now: now)
        return StoredAnswer(
            object: stale, parameters: parameters, age: age,
            notModified: CacheConditional.notModified(cache.requestFields, stored: stale.response))
    }

    /// The response ended whole: the tee's object is published.
    static func responseFinished(_ exchange: Exchange) {
        guard let cache = exchange.cache, let fill = cache.fill else { return }
        cache.fill = nil
        defer { cache.endFetch() }  // after the object is in the store: the waiting requests hit
        guard let evicted = fill.complete() else { return }
        exchange.reportCache(.stored(bytes: fill.total))
        if evicted > 0 { exchange.reportCache(.evicted(count: evicted)) }
    }

    /// A `304` validated the stored response: the answer from its update (nil: none was
    /// being validated).
    static func validatedAnswer(_ exchange: Exchange) -> StoredAnswer? {
        guard let cache = exchange.cache, let object = cache.validated else { return nil }
        let now = wallClockSeconds()
        return StoredAnswer(
            object: object, parameters: cache.parameters, age: CacheFreshness.currentAge(of: object.response, now: now),
            notModified: CacheConditional.notModified(cache.requestFields, stored: object.response))
    }

    /// The wall clock in seconds (RFC 9111's `request_time`, `response_time` and `now`).
    static func wallClockSeconds() -> Int64 {
        Int64(SystemClock().wallClockMilliseconds() / 1000)
    }
}

extension Exchange {
    /// Tells the monitors that watch cache events.
    func reportCache(_ event: CacheEvent) {
        guard let monitor, monitor.events.contains(.cache) else { return }
        monitor.handle(.cache(id: id, event: event))
    }
}

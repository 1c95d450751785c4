import SluiceCore

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
    var fetch: CacheFetch?
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

    /// The memory tier's registration for promoting the disk entry this lookup opens
    /// (`CachePromotion`), taken before the open; ended here unless a promotion took it.
    var promotionToken: UInt64?

    func takePromotionToken() -> (store: CacheStore, url: String, token: UInt64)? {
        guard let token = promotionToken else { return nil }
        promotionToken = nil
        return (store, url, token)
    }

    /// Ends the claim; `complete`: the whole body was stored (the fill told its readers so
    /// already; this wakes the requests still waiting for the head, which look again).
    func endFetch(complete: Bool = false) {
        if let fetch { store.endFetch(url, token: fetch.token, complete: complete) }
        fetch = nil
    }

    deinit {
        endFetch()
        if let promotionToken { store.memory.endFill(url, promotionToken) }
    }

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
}

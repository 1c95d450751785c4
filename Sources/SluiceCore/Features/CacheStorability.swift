/// Whether a response may be stored by a shared cache (RFC 9111 §3, §3.5), as a decision
/// with its reason. Only `GET` responses are stored (a `HEAD` is answered from a stored `GET`);
/// partial (`206`) and `304` responses are never stored as entries.
///
/// Beyond RFC 9111, one conservative rule: a response that sets a cookie is stored only when
/// the origin says explicitly that a shared cache may (`public` or `s-maxage`), or the policy
/// drops `Set-Cookie` before storing — a session cookie must not be handed to every client.
///
/// Threading: stateless; any thread.
public enum CacheStorability {
    public enum Refusal: String, Sendable, Equatable {
        case method, requestBody = "request-body", status, requestNoStore = "request-no-store", noStore = "no-store", `private`,
            authorization, varyStar = "vary-star", setCookie = "set-cookie", tooLarge = "too-large",
            notCacheable = "not-cacheable"
    }

    public enum Decision: Sendable, Equatable {
        case store
        case doNotStore(Refusal)
    }

    /// - Parameters:
    ///   - contentLength: the response's declared length, when it has one (checked against
    ///     `maxObjectSize` before any byte is kept; a body without one is checked as it streams).
    ///   - requestHasBody: the request carried a body: a `GET` with a body is never stored (its
    ///     key would be the body-less request's, so any client could replace the shared entry).
    public static func decide(
        method: String, requestFields: [CacheFields.Field], status: Int,
        responseFields: [CacheFields.Field], modification: CacheModification? = nil,
        contentLength: Int64? = nil, maxObjectSize: Int64 = .max,
        requestHasBody: Bool = false
    ) -> Decision {
        guard method == "GET" else { return .doNotStore(.method) }
        guard !requestHasBody else { return .doNotStore(.requestBody) }
        guard status >= 200, status <= 599, status != 206, status != 304 else { return .doNotStore(.status) }
        if CacheRequestDirectives(requestFields).cacheControl.noStore { return .doNotStore(.requestNoStore) }
        let cc = CacheControl(CacheFields.values("cache-control", in: responseFields))
        if cc.noStore { return .doNotStore(.noStore) }
        let ignored = modification?.ignoredDirectives ?? []
        if cc.isPrivate, !ignored.contains(.isPrivate) { return .doNotStore(.private) }
        if CacheFields.value("authorization", in: requestFields) != nil, !cc.isPublic, cc.sMaxAge == nil, !cc.mustRevalidate {
            return .doNotStore(.authorization)
        }
        let varyNames = CacheFields.listElements(CacheFields.values("vary", in: responseFields))
        if varyNames.contains("*") { return .doNotStore(.varyStar) }
        if CacheFields.value("set-cookie", in: responseFields) != nil, !cc.isPublic, cc.sMaxAge == nil,
            !(modification?.dropResponseHeaders.contains("set-cookie") ?? false)
        {
            return .doNotStore(.setCookie)
        }
        if let contentLength, contentLength > maxObjectSize { return .doNotStore(.tooLarge) }
        let explicit =
            cc.isPublic || cc.maxAge != nil || cc.sMaxAge != nil || CacheFields.value("expires", in: responseFields) != nil
            || modification?.freshness != nil
        guard explicit || CacheFreshness.heuristicallyCacheable.contains(status) else { return .doNotStore(.notCacheable) }
        return .store
    }

    /// The fields kept with a stored response: the policy's `drop_response_headers` removed
    /// (hop-by-hop fields never reach here: the encoder drops them on the way in).
    public static func storedFields(_ fields: [CacheFields.Field], modification: CacheModification?) -> [CacheFields.Field] {
        guard let drop = modification?.dropResponseHeaders, !drop.isEmpty else { return fields }
        return fields.filter { !drop.contains($0.name.lowercased()) }
    }

    /// The stored entry after a `304` validated it (RFC 9111 §4.3.4), or nil when the merged
    /// response may no longer be stored (the caller drops the entry). The `304`'s fields pass
    /// the same filter as a stored response's (`storedFields`), and its `Set-Cookie` is never
    /// kept (it is the revalidating client's: that client still gets it, the stored copy does
    /// not); the merged response is then decided again as a `GET` response for `requestFields`
    /// (a `304` may add `private` or `no-store`).
    public static func afterNotModified(
        _ stored: CacheStoredResponse, notModified: [CacheFields.Field],
        requestFields: [CacheFields.Field], modification: CacheModification?,
        requestTime: Int64, responseTime: Int64
    ) -> CacheStoredResponse? {
        let fields = storedFields(notModified, modification: modification)
            .filter { !$0.name.caseInsensitiveEquals("set-cookie") }
        let merged = stored.updated(with: fields, requestTime: requestTime, responseTime: responseTime)
        let decision = decide(
            method: "GET", requestFields: requestFields, status: merged.status,
            responseFields: merged.fields, modification: modification)
        return decision == .store ? merged : nil
    }
}

/// A request's cache directives (RFC 9111 §5.2.1), with `Pragma: no-cache` read as
/// `Cache-Control: no-cache` when the request has no `Cache-Control` (§5.4).
///
/// Threading: a value type; any thread.
public struct CacheRequestDirectives: Sendable, Equatable {
    public var cacheControl: CacheControl

    public init(_ requestFields: [CacheFields.Field]) {
        let values = CacheFields.values("cache-control", in: requestFields)
        var cc = CacheControl(values)
        if values.isEmpty, let pragma = CacheFields.combined("pragma", in: requestFields),
            CacheFields.listElements([pragma]).contains(where: { $0.lowercased() == "no-cache" })
        {
            cc.noCache = true
        }
        cacheControl = cc
    }
}

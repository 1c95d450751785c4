import SluiceCore

/// A try's response on its way back, in order: the one place that order is written, beside
/// `RequestChain` (docs/architecture.md draws both). It runs the try stages' response sides
/// in reverse (Envoy's `encodeHeaders` on the same filters as `decodeHeaders`): what the
/// origin said about its limit, how the try went for the circuit, the policy's scripts
/// (`on_response`), the exchange's decision on the head (validation, a retry, a redirect), and what the cache keeps.
///
/// `head` runs when a try's final response head arrives, until a stage answers anything but
/// `.proceed`; `end` runs when the try ends — its response complete, failed before a byte
/// reached the client, answered by an upgrade's handshake, or abandoned — every stage in
/// order. A resume's head (the rest of a broken download, judged by `ResumeState`) passes
/// `continuation` only; `answers` may answer from a stored response instead of the try's
/// (after a `304` a stage absorbed) or of Sluice's error (stale-if-error).
///
/// Threading: stateless; run on the exchange's worker thread.
enum ResponseChain {
    static let head: [any ResponseStage.Type] = [
        QuotaStage.self,  // rate_limit.learn: a pause the origin asked for
        CircuitStage.self,  // health: the try's outcome by its status
        LuaResponseStage.self,  // lua: on_response edits the head, or asks for a retry
        ResponseDecisionStage.self,  // validate, retry, redirect, credentials: the machine decides
        CacheStage.self,  // cache: a 304 merged, a tee that stores, an invalidation
    ]

    static let end: [any ResponseStage.Type] = [
        QuotaStage.self,  // rate_limit.max_concurrent: the try's place is given back
        CircuitStage.self,  // health: a try that ended without a head is an outcome too
        CacheStage.self,  // cache: the tee's object is published
    ]

    static let continuation: [any ResponseStage.Type] = [
        CircuitStage.self  // health: the resume's status is its try's outcome
    ]

    static let answers: [any ResponseStage.Type] = [
        CacheStage.self  // cache: a validated update, or stale-if-error
    ]

    /// Runs `head` on `response`; `.proceed` when every stage let it pass (it goes to the
    /// client as it is).
    static func runHead(
        _ response: inout ResponseHeadContext, _ exchange: Exchange, _ services: any StageServices
    )
        -> ResponseVerdict
    {
        run(head[...], &response, exchange, services)
    }

    /// Where `head` runs again once a kept response body arrived (`ResponseHeadContext.kept`):
    /// the scripts read it, then the stages after them decide as on a head.
    static let bodyStages = head[head.firstIndex { ObjectIdentifier($0) == ObjectIdentifier(LuaResponseStage.self) }!...]

    /// Runs `bodyStages` on `response`, whose `kept` is set; `.proceed` as for `runHead`.
    static func runBody(
        _ response: inout ResponseHeadContext, _ exchange: Exchange, _ services: any StageServices
    )
        -> ResponseVerdict
    {
        run(bodyStages, &response, exchange, services)
    }

    /// `stages` in order on `response`, up to the first verdict other than `.proceed`.
    private static func run(
        _ stages: ArraySlice<any ResponseStage.Type>, _ response: inout ResponseHeadContext, _ exchange: Exchange,
        _ services: any StageServices
    ) -> ResponseVerdict {
        for stage in stages {
            let verdict = stage.head(&response, exchange, services)
            guard case .proceed = verdict else { return verdict }
        }
        return .proceed
    }

    static func runEnd(_ ending: TryEnding, _ exchange: Exchange, _ services: any StageServices) {
        for stage in end { stage.end(ending, exchange, services) }
    }

    /// Runs `continuation` on a resume's head (its verdicts are the resume's own: it carries
    /// the body on or ends the response incomplete).
    static func runContinuation(
        _ response: inout ResponseHeadContext, _ exchange: Exchange, _ services: any StageServices
    ) {
        for stage in continuation { _ = stage.head(&response, exchange, services) }
    }

    /// The stored response that answers instead of the try's (`error` nil: a stage absorbed
    /// its `304`) or of Sluice's `error`; nil when none does.
    static func storedAnswer(replacing error: ProxyError?, _ exchange: Exchange) -> StoredAnswer? {
        for stage in answers {
            if let answer = stage.storedAnswer(replacing: error, exchange) { return answer }
        }
        return nil
    }
}

/// A step of a response's way back (`ResponseChain`): a try stage's other half. Each entry
/// has a default that does nothing, so a stage implements the side it has.
protocol ResponseStage: SendableMetatype {
    static var name: String { get }
    /// A try's final response head arrived (not an upgrade's `101`).
    static func head(
        _ response: inout ResponseHeadContext, _ exchange: Exchange, _ services: any StageServices
    )
        -> ResponseVerdict
    /// The try ended.
    static func end(_ ending: TryEnding, _ exchange: Exchange, _ services: any StageServices)
    /// A stored response that answers instead (`ResponseChain.answers`).
    static func storedAnswer(replacing error: ProxyError?, _ exchange: Exchange) -> StoredAnswer?
}

extension ResponseStage {
    static func head(
        _ response: inout ResponseHeadContext, _ exchange: Exchange, _ services: any StageServices
    )
        -> ResponseVerdict
    { .proceed }
    static func end(_ ending: TryEnding, _ exchange: Exchange, _ services: any StageServices) {}
    static func storedAnswer(replacing error: ProxyError?, _ exchange: Exchange) -> StoredAnswer? { nil }
}

/// A response head as the response stages see it, with what they learn about it.
struct ResponseHeadContext {
    /// As the origin sent it, or as a script's `on_response` edited it (`LuaResponseStage`).
    var response: UpstreamResponseHead
    let transfer: any UpstreamTransfer
    /// The request body could be sent again (none, or kept whole): a retry or redirect may.
    let canResendBody: Bool
    /// The origin asked for a pause its policy's `rate_limit` learned and waits for
    /// (`QuotaStage`): the exchange tries again after it when it may.
    var heldByOrigin = false
    /// A script called `res:retry()` (`LuaResponseStage`): the decision counts a failed try.
    var scriptRetry = false
    /// The body kept for the scripts that read it (`read_response_body`): nil on the head;
    /// set when `bodyStages` run on it.
    var kept: KeptBody?
}

/// A response body kept for the scripts (`UpstreamTransfer.collect`), and what they made of
/// it. Boxed, as `ResponseDisposition.Refusal`: every head's context pays one nil reference.
///
/// Threading: made and read on the exchange's worker thread, for one run of `bodyStages`.
final class KeptBody {
    enum Content {
        /// All of it, decoded from chunked: as it came, then the scripts' replacement.
        case whole([UInt8])
        /// More than the policy keeps (`HostPolicy.responseBodyLimit`): the transfer waits,
        /// mid-body, for the verdict (`collectionOverflowed`).
        case overLimit
    }

    var content: Content
    /// A script replaced the body (`res:set_body` with other bytes than the origin's).
    var replaced = false
    /// A script's failed call refused a whole kept body (`fail_closed`): its try has ended,
    /// so the exchange fails it itself (`.handled`).
    var refusal: ProxyError?

    init(_ content: Content) { self.content = content }
}

/// A response stage's answer about a head.
enum ResponseVerdict {
    /// The next stage takes it; after the last, the head goes to the client.
    case proceed
    /// The response is drained, never sent: the exchange tries again.
    case discard
    /// The response is a redirect the policy follows to this request.
    case follow(ProxyRequest)
    /// A stage answered the transfer itself (the cache absorbed a `304`, or forwarded the
    /// head with its tee).
    case handled
}

/// How a try ended, for the response stages' `end`.
enum TryEnding {
    /// Its response reached the client whole.
    case complete
    /// It failed before any response byte reached the client.
    case failed(ProxyError)
    /// An upgrade's handshake was answered with this status (its head goes to the client
    /// outside `head`: a `101` becomes a tunnel).
    case answered(status: Int)
    /// It stopped without an outcome of its own (the client left, the response was cut).
    case abandoned

    var healthOutcome: HealthOutcome {
        switch self {
        case .failed(let error): return HealthOutcome(error: error)
        case .answered(let status): return HealthOutcome(status: status)
        case .complete, .abandoned: return .abandoned
        }
    }
}

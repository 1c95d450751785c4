import CLibEvent
import SluiceCore

/// One try of a forwarded request to an origin, as the exchange drives it: the one interface
/// between the session core (`ClientConnection` and its `ExchangeMachine`) and a transport.
/// Two implementations sit behind it (docs/architecture.md, "Two transports"):
/// - `NativeUpstreamTransfer`: Sluice's own HTTP/1.1 client on the worker's loop, with a
///   per-worker keep-alive pool (`NativeUpstreamPool`) and the strict `HTTPResponseParser`;
///   the default for plain-http origins;
/// - `CurlUpstreamTransfer`: a libcurl easy handle on the worker's multi, for https, HTTP/2,
///   auth challenges and parent proxies.
/// `UpstreamEngine.choose` (SluiceCore) is the rule between them, per try.
///
/// Both tell their `UpstreamTransferDelegate` the same events in the same order, read the
/// request body from a `RequestBodySource` on demand, and write the response into the
/// client's output buffer re-framed by `ResponseEncoder`.
///
/// Threading: created, driven and finished on its worker's thread only.
protocol UpstreamTransfer: AnyObject {
    /// The origin this try goes to.
    var target: RequestTarget { get }
    /// Response bytes reached the client's output (a drained redirect or retry sends none).
    var responseStarted: Bool { get }
    /// The client's response is framed by the end of the connection (an HTTP/1.0 client and
    /// an upstream body without a length): only the kind of close tells a cut from the end.
    var framedByClose: Bool { get }
    /// Keeps a copy of the body sent to the client, for the shared cache (set by the
    /// delegate while it answers `responseHeadArrived`; nil without a cache).
    var cacheFill: CacheFill? { get set }
    /// Field lines (each ending in CRLF) added to the forwarded head after `Via`: the
    /// cache's `Cache-Status`. Empty without a cache.
    var extraHeadLines: [UInt8] { get set }
    /// Body bytes of this try that reached the client's output (before re-framing).
    var bodyBytesSent: Int64 { get }
    /// How the client's response is framed (once its head was written, or continued).
    var clientFraming: ResponseEncoder.Framing { get }
    /// The final response head the client's response was made from (nil before it, and for
    /// a response that was not forwarded); valid until the transfer goes.
    var forwardedHead: UpstreamResponseHead? { get }
    /// The request this try sent and the route it took, for a `GET` (a resume repeats them,
    /// `Resume`); nil for other methods.
    var resumableTry: (request: UpstreamRequest, route: UpstreamRoute)? { get }
    /// The try ended because `timeouts.total` ran out (a download over its time is not resumed).
    var deadlineExceeded: Bool { get }
    /// Set before `start` on a try that carries on a response the client is already
    /// receiving (a resumed download, `Resume`): its head is never forwarded but judged by
    /// `UpstreamTransferDelegate.continuationArrived`, its body goes on in this framing, no
    /// interim response is forwarded, it reports no try (`tryEnded`), and whatever ends it
    /// early is `transferAborted` (the client has the head already).
    var continuing: ResponseEncoder.Framing? { get set }

    /// Starts the try and its per-try timer (start → response head), in milliseconds.
    func start(perTryTimeout: Int)
    /// Detaches from the origin and the client. Safe to call more than once; the delegate
    /// hears nothing more after it (but `tryEnded`, once, if the try had not ended).
    func cancel()

    // Answers to `UpstreamTransferDelegate.responseHeadArrived` (only inside that call).

    /// Send the response to the client; `keepAlive` says whether its head promises to keep
    /// the client connection open.
    func forward(keepAlive: Bool)
    /// Drain this response's body, then go on with `next` (`transferRedirected`).
    func follow(_ next: UpstreamRequest)
    /// Drain this response's body for a retry (`transferDiscarded`).
    func discard()
    /// Drain the response without sending it (a `304` that validated a stored response),
    /// then `transferAbsorbed`.
    func absorb()
    /// Send nothing of the response: the try fails with `error` (`transferFailed`, kind
    /// `.other`) and its connection is closed (a script's `on_response` failed).
    func refuse(_ error: ProxyError)
    /// Send nothing yet: keep the body (decoded from chunked) for a script that reads it
    /// (`read_response_body`), then `transferCollected` once it ended — or, past `limit`
    /// bytes, `collectionOverflowed`, answered like a head.
    func collect(limit: Int)
    /// The head to forward instead of the one that arrived (a script's header edits), with
    /// the same status and framing fields; before `forward`.
    func replaceHead(_ head: ResponseHeadCollector)

    /// Hands the rest of the response to `delegate` (a `FillProducer`): the body goes on into
    /// the cache's tee only, at the origin's pace, and nothing more is written to the client's
    /// output (its exchange reads the fill instead, or has gone). A paused download resumes.
    func detach(to delegate: any UpstreamTransferDelegate)

    /// The client drained its output below the low watermark.
    func resumeDownload()
    /// The client sent more request body.
    func resumeUpload()
}

/// A transfer's answer to `responseHeadArrived`, and what it then does with the response's
/// body: one value both transports keep, so that the four answers mean the same on either.
/// A redirect's request (433 bytes) is boxed, in the answer and once taken: the disposition
/// is 48 bytes, not 896, and the copies of `answer` on every response are 9 bytes, not 433.
///
/// Threading: a value inside its transfer, on the worker's thread.
struct ResponseDisposition {
    enum Answer {
        /// Send the head (promising to keep the client connection open or not) and the body.
        case forward(keepAlive: Bool)
        /// Drain the body, then go on with this request (a followed redirect).
        indirect case follow(UpstreamRequest)
        /// Drain the body, then tell the delegate `transferDiscarded` (the exchange retries).
        case discard
        /// Drain the body, then tell the delegate `transferAbsorbed` (the cache answers).
        case absorb
        /// Fail the try with this error, sending nothing (`refused`).
        case refuse(Refusal)
        /// Keep the body, up to this many bytes, sending nothing (`collector`).
        case collect(limit: Int)
    }

    /// A `refuse` answer's error (boxed: `Answer` and the disposition keep their size, and
    /// a transfer never refused pays one nil reference).
    final class Refusal {
        let error: ProxyError
        init(_ error: ProxyError) { self.error = error }
    }

    /// The delegate's answer to the current `responseHeadArrived` (nil outside that call).
    var answer: Answer?
    /// Set when the response is a redirect the exchange follows: its body is drained, not sent.
    var redirectTo: UpstreamRequest? {
        get { redirect?.request }
        set { redirect = newValue.map(Redirect.init) }
    }
    private var redirect: Redirect?

    /// `Box` would do, but it requires `Sendable`, which a request (its header lines) is not.
    private final class Redirect {
        let request: UpstreamRequest
        init(_ request: UpstreamRequest) { self.request = request }
    }
    /// Set when the response is discarded for a retry: its body is drained, not sent.
    var discarding = false
    /// Set with `discarding` when the response was absorbed by the cache (`absorb()`).
    var absorbing = false
    /// The `refuse` answer, for the transfer to fail the try with after `settle`.
    var refused: Refusal?
    /// The `collect` answer: the body kept so far, while it is kept.
    var collector: Collector?

    /// The body is drained, not sent (a redirect to follow, a retry, a cache absorb).
    var drains: Bool { discarding || redirect != nil }
    /// Nothing of the response reaches the client: its body is drained or kept.
    var withholds: Bool { drains || collector != nil }

    /// A `collect` answer's body (boxed, as `Refusal`: a transfer that never collects pays
    /// one nil reference). Its bytes are the decoded body, in order.
    final class Collector {
        let limit: Int
        private(set) var body: [UInt8] = []
        init(limit: Int) { self.limit = limit }

        /// Keeps `data`; false when the body is now over the limit (`data` is kept all the
        /// same, for a response that goes on to the client after all).
        func append(_ data: UnsafeRawBufferPointer) -> Bool {
            body.append(contentsOf: data)
            return body.count <= limit
        }
    }

    /// Takes the delegate's answer (a forward with a close when it gave none): the keep-alive
    /// promise when the response goes to the client, nil when its body is to be drained.
    mutating func settle() -> Bool? {
        let given = answer ?? .forward(keepAlive: false)
        answer = nil
        switch given {
        case .forward(let keepAlive):
            return keepAlive
        case .follow(let next):
            redirectTo = next
        case .discard:
            discarding = true
        case .absorb:
            discarding = true
            absorbing = true
        case .refuse(let error):
            refused = error
        case .collect(let limit):
            collector = Collector(limit: limit)
        }
        return nil
    }
}

/// What happens to a transfer, told to the client side of its exchange (implemented by
/// `ClientConnection`). Events only: nothing here returns a decision. The one decision a
/// transfer needs — what to do with a final response head — is asked for by
/// `responseHeadArrived`, and answered by calling `forward(keepAlive:)`, `follow(_:)` or
/// `discard()` on the transfer before that call returns.
///
/// Threading: every call happens on the worker's thread, from a transport's callback, a timer
/// or `cancel()`.
protocol UpstreamTransferDelegate: AnyObject {
    /// The final response head arrived (once per try, before any byte of it reaches the
    /// client). The delegate answers on `transfer` before returning; with no answer the head
    /// is forwarded with a close. The head is the delegate's (consumed: it moves into the
    /// response stages' context, not copied).
    func responseHeadArrived(_ head: consuming UpstreamResponseHead, on transfer: any UpstreamTransfer)
    /// An interim (1xx, not 101) head arrived before the final one, with its end-to-end fields.
    func interimResponse(status: Int, fields: [(name: String, value: String)])
    /// The response head went to the client (`status`), or the body bytes did (`bytes`).
    func responseStarted(status: Int)
    func responseBodySent(bytes: Int)
    /// A try ended; `timings` come from its transport.
    func tryEnded(timings: TryTimings)
    /// The redirect response was drained; the exchange goes on with `next`.
    func transferRedirected(to next: UpstreamRequest)
    /// A discarded response was drained (or its transfer ended): the exchange retries.
    func transferDiscarded()
    /// An absorbed response (a `304` that validated a stored one) ended; nothing of it
    /// reached the client, which the exchange now answers from the cache.
    func transferAbsorbed()
    /// A collected response (`collect`) ended whole: its head and decoded body; nothing of it
    /// reached the client, which the exchange now answers itself. The try has ended.
    func transferCollected(_ head: UpstreamResponseHead, body: [UInt8])
    /// A collected response's body passed its limit: the delegate answers on `transfer` as
    /// for a head (`forward`: the head, the body kept so far and the rest are sent; `discard`,
    /// `follow`, `refuse`), before returning; with no answer the response is forwarded with a
    /// close.
    func collectionOverflowed(_ head: UpstreamResponseHead, on transfer: any UpstreamTransfer)
    /// The response is complete; `reusable` is false when it was close-delimited.
    func transferFinished(reusable: Bool)
    /// The exchange failed before any response byte reached the client.
    func transferFailed(_ error: ProxyError, kind: TransportErrorKind)
    /// The exchange failed after response bytes reached the client: the connection must end
    /// without completing the message — unless the download is resumed (`Resume`).
    func transferAborted()
    /// The client's output passed the high watermark while the response's body is published
    /// to others (a shared fill): true when the delegate detached the transfer (`detach`), so
    /// that the fill goes on at the origin's pace instead of the client's; false: pause.
    func clientFellBehind(_ transfer: any UpstreamTransfer) -> Bool
    /// A continuing try's (`UpstreamTransfer.continuing`) final head arrived: true when it
    /// carries the body on (its body then follows), false when it cannot (the transfer then
    /// aborts, and the response ends incomplete).
    func continuationArrived(_ head: UpstreamResponseHead) -> Bool
}

/// The request body a transfer uploads, read on its transport's demand: a stream, not an event
/// sink (as URLSession takes an input stream). Implemented by `ClientConnection`, which
/// decodes it from the client's input (or replays what `RequestBodyReader` kept).
///
/// Threading: called from a transport's callbacks (libcurl's read and seek, the native
/// transport's socket events), on the worker's thread.
protocol RequestBodySource: AnyObject {
    /// Copies up to `capacity` decoded request-body bytes into `buffer`. Returns the count,
    /// 0 at the end of the body, `nil` when no bytes are available yet (the transfer pauses
    /// until `resumeUpload`), or throws the error that rejects the request.
    func readRequestBody(into buffer: UnsafeMutableRawPointer, capacity: Int) throws(ProxyError) -> Int?
    /// Rewinds the body to be sent again (an auth challenge, a resend on a new connection);
    /// false if it can't.
    func rewindRequestBody() -> Bool
}

/// What the exchange needs to decide about a response head.
struct UpstreamResponseHead {
    let collected: ResponseHeadCollector
    var status: Int { collected.status }
    func value(_ lowercaseName: String) -> String? { collected.value(lowercaseName) }
}

/// A request ready for the session core: everything a transport needs, with the header lines
/// already built (the native transport writes them as they are; libcurl gets them converted,
/// `CurlHeaderList`).
struct UpstreamRequest {
    enum Body: Equatable {
        case none
        case length(Int64)
        /// Unknown length: sent chunked.
        case streamed
    }
    var method: String
    var target: RequestTarget
    var headers: RequestHeaderLines
    var body: Body
    /// The pipeline's view of it, when the exchange built one (adapters, monitors, redirects).
    var model: ProxyRequest? {
        get { rare?.value.model }
        set { setRare(newValue) { $0.model = newValue } }
    }
    /// Answers Basic and Digest challenges (the policy's `credentials`).
    var credentials: Credentials? {
        get { rare?.value.credentials }
        set { setRare(newValue) { $0.credentials = newValue } }
    }
    /// The target host's trust evaluator and client certificate (set when the try starts:
    /// a followed redirect may change the host).
    var trust: ServerTrust = .builtInDefault
    var clientCertificate: ClientCertificate? {
        get { rare?.value.clientCertificate }
        set { setRare(newValue) { $0.clientCertificate = newValue } }
    }
    /// Connection reuse limits for a TLS try after a reload (`UpstreamTLS.reuse`).
    var reuse = UpstreamTLS.ConnectionReuse()
    /// The target host's parent proxy (`upstream_proxy`), set when the try starts.
    var parentProxy: UpstreamProxy? {
        get { rare?.value.parentProxy }
        set { setRare(newValue) { $0.parentProxy = newValue } }
    }
    /// The target host's HTTP version policy (`upstream.http2`), set when the try starts.
    var http2 = HTTP2Mode.auto
    /// What is left of `timeouts.total` for a try that carries on a response (a resume), in
    /// ms; nil: the configured `timeouts.total`.
    var totalTimeout: Int?
    /// A resume (`ResumeState`): the try carries on a response whose upstream broke, by the
    /// broken try's route (the same origin over the same engine). The exchange's machine is not
    /// asked: its try is the one being carried on.
    var resumes: UpstreamRoute?

    var isHead: Bool { method == "HEAD" }

    init(
        method: String, target: RequestTarget, headers: RequestHeaderLines, body: Body, model: ProxyRequest? = nil,
        credentials: Credentials? = nil
    ) {
        self.method = method
        self.target = target
        self.headers = headers
        self.body = body
        self.model = model
        self.credentials = credentials
    }

    // The fields most requests leave nil, boxed: inline they made a request 433 bytes (176
    // now), and a transfer, which holds one, too large for malloc's per-thread cache; each
    // copy of a request on its way to a transport was a `memcpy` of all of it, too. A box is
    // never changed once made (a setter makes a new one), so copies stay independent values.
    private struct RareFields {
        var model: ProxyRequest?
        var credentials: Credentials?
        var clientCertificate: ClientCertificate?
        var parentProxy: UpstreamProxy?

        var isEmpty: Bool {
            if case .some = model { return false }
            if case .some = credentials { return false }
            if case .some = clientCertificate { return false }
            if case .some = parentProxy { return false }
            return true
        }
    }

    private var rare: Box<RareFields>?

    /// Sets one rare field to `value` through `change`: nothing to do for nil without a box
    /// (every try sets them, nearly always to nil).
    private mutating func setRare<T>(_ value: T?, _ change: (inout RareFields) -> Void) {
        if rare == nil, case .none = value { return }
        var fields = rare?.value ?? RareFields()
        change(&fields)
        rare = fields.isEmpty ? nil : Box(fields)
    }
}

import CCurl
import CLibEvent
import CShims
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// The `SessionContext` adapters get on one worker: token fetches through this worker's
/// libcurl multi, and a parking lot for requests waiting on work another worker may finish.
///
/// Threading: owned by its worker's thread. Only `waker` crosses threads.
final class WorkerSession: SessionContext {
    private unowned let worker: Worker
    private var parked: [() -> Bool] = []
    var sharedTokens: (any SharedTokenStore)? { worker.fleet }
    /// Made on the first call of a script that may wait.
    private var luaHost: WorkerLuaHost?
    var lua: (any LuaHost)? {
        if let luaHost { return luaHost }
        let host = WorkerLuaHost(worker: worker)
        luaHost = host
        return host
    }
    private let mailbox: Worker.Mailbox
    private var wakeEvent: LoopWake<WorkerSession>!
    var waker: any SessionWaker { Waker(event: wakeEvent.handle, id: worker.index, mailbox: mailbox) }

    /// Activates the wake only under the worker's mailbox lock while the mailbox is open: the
    /// worker closes it before `close()` drops the event, so a token fetch that ends on
    /// another worker after this one stopped wakes nothing.
    struct Waker: SessionWaker {
        let event: LoopWake<WorkerSession>.Handle
        let id: Int
        let mailbox: Worker.Mailbox
        func wake() {
            mailbox.contents.withLock { contents in
                guard !contents.closed else { return }
                event.activate()
            }
        }
    }

    init(worker: Worker, mailbox: Worker.Mailbox) {
        self.worker = worker
        self.mailbox = mailbox
        wakeEvent = LoopWake(on: worker.base, owner: self, crossThread: true) { $0.runParked() }
    }

    func close() {
        luaHost?.close()
        wakeEvent = nil
    }

    var monitor: (any EventMonitor)? { worker.pipeline.monitor }

    func park(_ work: @escaping () -> Bool) { parked.append(work) }

    private func runParked() {
        let work = parked
        parked = []
        for item in work where !item() { parked.append(item) }
    }

    func post(
        url: String, headers: [(String, String)], body: [UInt8],
        completion: @escaping (Result<(status: Int, body: [UInt8]), ProxyError>) -> Void
    ) {
        let policy = worker.pipeline.policies.match(host: URLParts(url).host)
        var url = url
        if let override = policy.upstream, let target = try? RequestTarget.absolute(url), target.scheme == .http,
            let upgraded = try? target.overridden(by: override)
        {
            url = upgraded.url  // a token endpoint's host gets its upstream override too
        }
        let fetch = SideFetch(
            session: worker.session, config: worker.config, policy: policy, url: url, headers: headers,
            body: body, reuse: UpstreamTLS.reuse(current: worker.pipeline, exchangeSnapshot: nil),
            completion: completion)
        fetch.start()
    }
}

/// A small request Sluice makes for itself (an OAuth token's POST, a health probe's GET when
/// `body` is nil, the cache's background revalidation with `fieldsSink`), on the worker's multi, with
/// the same TLS verification and the same `access.deny` check (on every resolved address,
/// before the socket exists) as forwarded requests. Keeps itself alive until done.
final class SideFetch: CurlTransfer {
    static let maxResponseBytes = 1 << 20
    private let session: UpstreamSession
    private let handle: UnsafeMutableRawPointer
    /// Its few fields (a token request's), by `curl_slist_append`: a side fetch always goes by
    /// libcurl, once in a while, so it does without `RequestHeaderLines` and `CurlHeaderList`.
    private var headerList: UnsafeMutablePointer<curl_slist>?
    private var response: [UInt8] = []
    private let completion: (Result<(status: Int, body: [UInt8]), ProxyError>) -> Void
    private let host: String
    private let trust: ServerTrust
    private var parentProxy: UpstreamProxy?
    /// Sent through this Sluice's own listener (`route(throughListener:)`): a proxy too, whose
    /// answer to an https fetch's `CONNECT` libcurl polls for.
    private var throughListener = false
    private let isTLS: Bool
    private let errorBuffer: UnsafeMutablePointer<CChar>
    private var me: Unmanaged<SideFetch>?
    private var deny: [IPNetwork]
    /// A resolved address was in `access.deny`: the fetch fails as `destinationDenied`.
    private var denied = false
    /// The largest response body kept; a larger one fails the fetch (1 MiB unless set before `start`).
    var maxBytes = SideFetch.maxResponseBytes
    /// Set before `start` to receive the final response's header fields (the cache's
    /// background revalidation); called on the worker's thread just before `completion`.
    var fieldsSink: (([(name: String, value: String)]) -> Void)?
    private var fields: [(name: String, value: String)] = []

    /// `interceptionCA`: the fetch goes through this Sluice's listener to a host whose policy
    /// intercepts (`route(throughListener:)`), so its TLS is with the interception, whose leaf
    /// comes from this Sluice's CA (this certificate, PEM, as the interception holds it in
    /// memory: not the file, which `sluice ca init --force` may have replaced since) and which
    /// checks the origin itself under the policy's trust. The fetch trusts that CA alone, with
    /// none of the origin's pins, revocation checks or client certificate.
    init(
        session: UpstreamSession, config: ServerConfiguration, policy: HostPolicy, url: String,
        headers: [(String, String)], body: [UInt8]?, reuse: UpstreamTLS.ConnectionReuse,
        interceptionCA: String? = nil,
        completion: @escaping (Result<(status: Int, body: [UInt8]), ProxyError>) -> Void
    ) {
        self.session = session
        self.completion = completion
        host = URLParts(url).host
        trust = policy.trust
        parentProxy = policy.upstreamProxy
        isTLS = url.lowercased().hasPrefix("https:")  // after any upstream override
        deny = config.access.deny
        handle = session.makeHandle().handle
        errorBuffer = .allocate(capacity: Int(CURL_ERROR_SIZE) + 1)
        errorBuffer.initialize(repeating: 0, count: Int(CURL_ERROR_SIZE) + 1)
        super.init()
        let h = handle
        sluice_easy_setopt_str(h, CURLOPT_URL, url)
        sluice_easy_setopt_str(h, CURLOPT_PROTOCOLS_STR, "http,https")
        sluice_easy_setopt_long(h, CURLOPT_CONNECTTIMEOUT_MS, config.timeouts.upstreamConnect)
        sluice_easy_setopt_long(h, CURLOPT_TIMEOUT_MS, config.timeouts.upstreamPerTry)
        sluice_easy_setopt_ptr(h, CURLOPT_ERRORBUFFER, errorBuffer)
        policy.upstreamProxy?.apply(to: h)  // a token endpoint behind the parent, like its host's requests
        CurlUpstreamTransfer.applyProtocol(policy.http2.protocolChoice(https: isTLS), to: h)  // and its upstream.http2
        if isTLS, var interceptionCA {
            // Copied by libcurl (`CURL_BLOB_COPY`); the blob replaces `CAINFO`.
            interceptionCA.withUTF8 { pem in
                var blob = curl_blob(
                    data: UnsafeMutableRawPointer(mutating: pem.baseAddress), len: pem.count, flags: UInt32(CURL_BLOB_COPY))
                _ = sluice_easy_setopt_ptr(h, CURLOPT_CAINFO_BLOB, &blob)
            }
            sluice_easy_setopt_ptr(h, CURLOPT_CAPATH, nil)
            sluice_easy_setopt_long(h, CURLOPT_SSL_VERIFYPEER, 1)
            sluice_easy_setopt_long(h, CURLOPT_SSL_VERIFYHOST, 2)
        } else if isTLS {
            UpstreamTLS.configure(
                h, trust: policy.trust, clientCertificate: policy.clientCertificate,
                defaultCAFile: config.tls.caFile)
            reuse.apply(to: h)
        }
        if let body {
            sluice_easy_setopt_long(h, CURLOPT_POSTFIELDSIZE, body.count)
            body.withUnsafeBufferPointer { buf in
                _ = buf.withMemoryRebound(to: CChar.self) {
                    sluice_easy_setopt_ptr(h, CURLOPT_COPYPOSTFIELDS, UnsafeMutableRawPointer(mutating: $0.baseAddress))
                }
            }
        } else {
            sluice_easy_setopt_long(h, CURLOPT_HTTPGET, 1)
        }
        for (name, value) in headers { headerList = sluice_curl_slist_append(headerList, "\(name): \(value)") }
        sluice_easy_setopt_ptr(h, CURLOPT_HTTPHEADER, headerList)
    }

    deinit { errorBuffer.deallocate() }

    /// Sends the fetch through this Sluice's own listener at `proxy` (`http://127.0.0.1:3128`)
    /// as a forward-proxy request, over HTTP/1.1, with `method` (a `sluice.http`
    /// sub-request): the listener applies `access` and the target's policy, so the hop to it
    /// is not checked against `access.deny` here. Call before `start`.
    func route(throughListener proxy: String, method: String, hasBody: Bool, timeoutMilliseconds: Int) {
        let h = handle
        // Whatever a parent proxy of the target's policy set goes: no credentials or
        // `no_proxy` list of it may apply to the hop to this Sluice.
        sluice_easy_setopt_str(h, CURLOPT_PROXY, proxy)
        sluice_easy_setopt_long(h, CURLOPT_PROXYTYPE, Int(CURLPROXY_HTTP.rawValue))
        sluice_easy_setopt_str(h, CURLOPT_NOPROXY, "")
        sluice_easy_setopt_ptr(h, CURLOPT_PROXYUSERNAME, nil)
        sluice_easy_setopt_ptr(h, CURLOPT_PROXYPASSWORD, nil)
        sluice_easy_setopt_long(h, CURLOPT_HTTP_VERSION, Int(CURL_HTTP_VERSION_1_1))
        sluice_easy_setopt_long(h, CURLOPT_TIMEOUT_MS, max(1, timeoutMilliseconds))
        if method == "HEAD" {
            sluice_easy_setopt_long(h, CURLOPT_NOBODY, 1)
        } else if method != "GET" || hasBody {
            sluice_easy_setopt_str(h, CURLOPT_CUSTOMREQUEST, method)
        }
        parentProxy = nil
        throughListener = true
        deny = []
    }

    /// Abandons a started fetch: `completion` is never called.
    func cancel() {
        guard let me else { return }
        session.finish(handle)
        sluice_curl_slist_free_all(headerList)
        headerList = nil
        fieldsSink = nil
        self.me = nil
        me.release()
    }

    func start() {
        if isTLS, !trust.isAllowed {
            completion(.failure(trust.refusal(authority: host)))
            session.discard(handle)
            sluice_curl_slist_free_all(headerList)
            headerList = nil
            return
        }
        me = Unmanaged.passRetained(self)  // released in curlDone
        let raw = me!.toOpaque()
        sluice_easy_setopt_ptr(handle, CURLOPT_PRIVATE, raw)
        sluice_easy_setopt_ptr(handle, CURLOPT_WRITEDATA, raw)
        sluice_easy_setopt_ptr(handle, CURLOPT_OPENSOCKETDATA, raw)
        sluice_easy_setopt_opensocket_cb(handle) { clientp, _, address in
            let f = Unmanaged<SideFetch>.fromOpaque(clientp!).takeUnretainedValue()
            if withUnsafePointer(to: &address!.pointee.addr, { SocketAddress.matches($0, f.deny) }) {
                f.denied = true
                return CURL_SOCKET_BAD
            }
            let fd = socket(address!.pointee.family, address!.pointee.socktype, address!.pointee.protocol)
            // A proxy's answer to `CONNECT` is read after a real poll (`pollsForReal`): without
            // it, an https `sluice.http` through the listener waited for good.
            if f.parentProxy != nil || f.throughListener { f.session.connectsToParentProxy(fd) }
            return fd
        }
        sluice_easy_setopt_data_cb(handle, CURLOPT_WRITEFUNCTION) { ptr, size, count, ud in
            let f = Unmanaged<SideFetch>.fromOpaque(ud!).takeUnretainedValue()
            let n = size * count
            guard f.response.count + n <= f.maxBytes else { return 0 }
            f.response.append(contentsOf: UnsafeRawBufferPointer(start: ptr, count: n))
            return n
        }
        if fieldsSink != nil {
            sluice_easy_setopt_ptr(handle, CURLOPT_HEADERDATA, raw)
            sluice_easy_setopt_data_cb(handle, CURLOPT_HEADERFUNCTION) { ptr, size, count, ud in
                let f = Unmanaged<SideFetch>.fromOpaque(ud!).takeUnretainedValue()
                let n = size * count
                let line = String(decoding: UnsafeRawBufferPointer(start: ptr, count: n), as: UTF8.self)
                if line.hasPrefix("HTTP/") {
                    f.fields = []  // a new response (after a 1xx): only the final one's fields count
                } else if let colon = line.firstIndex(of: ":") {
                    let name = String(line[..<colon])
                    var value = line[line.index(after: colon)...]
                    while let c = value.first, c == " " || c == "\t" { value = value.dropFirst() }
                    while let c = value.last, c == " " || c == "\t" || c == "\r" || c == "\n" || c == "\r\n" {
                        value = value.dropLast()
                    }
                    f.fields.append((name: name, value: String(value)))
                }
                return n
            }
        }
        session.start(handle)
    }

    override func curlDone(_ result: CURLcode) {
        var status = 0
        sluice_easy_getinfo_long(handle, CURLINFO_RESPONSE_CODE, &status)
        // Read from the handle before it goes back to the session (reset or destroyed).
        let error: ProxyError? =
            result == CURLE_OK
            ? nil
            : denied
                ? .destinationDenied(host: parentProxy?.host ?? host)
                : CurlFailure.error(
                    result, handle: handle, message: errorBuffer[0] != 0 ? String(cString: errorBuffer) : nil,
                    host: host, authority: host, purpose: .tokenRequest, trust: isTLS ? trust : nil, parent: parentProxy)
        session.finish(handle)
        sluice_curl_slist_free_all(headerList)
        headerList = nil
        if error == nil, let sink = fieldsSink { sink(fields) }
        fieldsSink = nil
        if let error {
            completion(.failure(error))
        } else {
            completion(.success((status: status, body: response)))
        }
        me?.release()
        me = nil
    }
}

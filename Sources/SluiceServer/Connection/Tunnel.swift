import CCurl
import CLibEvent
import CShims
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// Opens the TCP connection for a CONNECT through the session core, so tunnels get the same
/// resolver (threaded, with the shared DNS cache), connect timeout and `access.deny` check
/// (on every resolved address) as forwarded requests. libcurl connects (`CONNECT_ONLY`);
/// the socket is then duplicated and the easy handle destroyed, leaving Sluice the only owner.
///
/// Threading: the worker's event-loop thread.
final class TunnelDialer: CurlTransfer {
    private unowned let connection: ClientConnection
    private let session: UpstreamSession
    private let handle: UnsafeMutableRawPointer
    let target: RequestTarget
    private let deny: [IPNetwork]
    private var denied = false
    private var finished = false

    /// The destination's parent proxy: the tunnel is a `CONNECT` through it.
    private let parent: UpstreamProxy?

    init(connection: ClientConnection, target: RequestTarget, parent: UpstreamProxy?) {
        self.connection = connection
        self.session = connection.worker.session
        self.target = target
        self.parent = parent
        self.deny = connection.worker.config.access.deny
        handle = connection.worker.session.makeHandle().handle
        super.init()
        let h = handle
        let me = Unmanaged.passUnretained(self).toOpaque()
        sluice_easy_setopt_ptr(h, CURLOPT_PRIVATE, me)
        sluice_easy_setopt_str(h, CURLOPT_URL, "http://\(target.authority)/")
        sluice_easy_setopt_str(h, CURLOPT_PROTOCOLS_STR, "http")
        sluice_easy_setopt_long(h, CURLOPT_CONNECT_ONLY, 1)
        parent?.apply(to: h, tunnel: true)
        sluice_easy_setopt_long(h, CURLOPT_CONNECTTIMEOUT_MS, connection.worker.config.timeouts.upstreamConnect)
        sluice_easy_setopt_ptr(h, CURLOPT_OPENSOCKETDATA, me)
        sluice_easy_setopt_opensocket_cb(h) { clientp, _, address in
            let d = Unmanaged<TunnelDialer>.fromOpaque(clientp!).takeUnretainedValue()
            let denied = withUnsafePointer(to: &address!.pointee.addr) { SocketAddress.matches($0, d.deny) }
            if denied {
                d.denied = true
                return CURL_SOCKET_BAD
            }
            let fd = socket(address!.pointee.family, address!.pointee.socktype, address!.pointee.protocol)
            if d.parent != nil { d.session.connectsToParentProxy(fd) }
            return fd
        }
    }

    func start() { session.start(handle) }

    func cancel() {
        guard !finished else { return }
        finished = true
        session.discard(handle)
    }

    override func curlDone(_ result: CURLcode) {
        guard !finished else { return }
        var fd: curl_socket_t = -1
        if result == CURLE_OK { sluice_easy_getinfo_socket(handle, &fd) }
        let owned = fd >= 0 ? dup(fd) : -1
        let deniedHost = parent?.host ?? target.host  // with a parent, its address was checked
        let error: ProxyError? =
            owned >= 0
            ? nil
            : denied
                ? .destinationDenied(host: deniedHost)
                : CurlFailure.error(
                    result, handle: handle, message: nil, host: target.host, authority: target.authority,
                    purpose: .tunnel, trust: nil, parent: parent)
        cancel()  // the handle is gone after this
        if let error {
            connection.driver.tunnels.failed(error)
            return
        }
        evutil_make_socket_nonblocking(owned)
        connection.driver.tunnels.established(fd: owned)
    }
}

/// A CONNECT byte tunnel between the client's bufferevent and the destination's, moving
/// evbuffer chains without copying. Backpressure both ways: a side stops reading while the
/// other side's output holds more than the high watermark, and resumes when it drains.
///
/// Threading: owned by its `ClientConnection`, on the worker's event-loop thread.
final class Tunnel {
    static let highWatermark = 1 << 20

    private unowned let connection: ClientConnection
    private var upstream: OpaquePointer?

    init(connection: ClientConnection, upstreamFD: Int32) {
        self.connection = connection
        let bev = bufferevent_socket_new(connection.worker.base, upstreamFD, Int32(BEV_OPT_CLOSE_ON_FREE.rawValue))!
        upstream = bev
        bufferevent_setcb(
            bev,
            { _, arg in
                Unmanaged<Tunnel>.fromOpaque(arg!).takeUnretainedValue().upstreamReadable()
            },
            { _, arg in
                Unmanaged<Tunnel>.fromOpaque(arg!).takeUnretainedValue().upstreamDrained()
            },
            { _, what, arg in
                Unmanaged<Tunnel>.fromOpaque(arg!).takeUnretainedValue().upstreamEvent(what)
            }, Unmanaged.passUnretained(self).toOpaque())
        bufferevent_setwatermark(bev, Int16(EV_WRITE), ClientConnection.outputLowWatermark, 0)
        bufferevent_enable(bev, Int16(EV_READ | EV_WRITE))
    }

    func clientReadable() {
        guard let upstream else { return }
        let out = bufferevent_get_output(upstream)
        connection.driver.tunnels.moved(up: evbuffer_get_length(connection.clientInput), down: 0)
        evbuffer_add_buffer(out, connection.clientInput)
        connection.inputConsumed()
        if evbuffer_get_length(out) >= Self.highWatermark { connection.setReading(false) }
    }

    func clientDrained() {
        if let upstream { bufferevent_enable(upstream, Int16(EV_READ)) }
    }

    func clientClosed() {
        connection.close()
    }

    private func upstreamReadable() {
        guard let upstream else { return }
        let out = connection.clientOutput
        connection.driver.tunnels.moved(up: 0, down: evbuffer_get_length(bufferevent_get_input(upstream)))
        evbuffer_add_buffer(out, bufferevent_get_input(upstream))
        connection.scheduleFlush()
        if evbuffer_get_length(out) >= Self.highWatermark { bufferevent_disable(upstream, Int16(EV_READ)) }
    }

    private func upstreamDrained() {
        connection.setReading(true)
    }

    private func upstreamEvent(_ what: Int16) {
        guard what & Int16(BEV_EVENT_EOF | BEV_EVENT_ERROR) != 0, let upstream else { return }
        // Deliver what the destination sent before it closed, then end the client side.
        connection.driver.tunnels.moved(up: 0, down: evbuffer_get_length(bufferevent_get_input(upstream)))
        evbuffer_add_buffer(connection.clientOutput, bufferevent_get_input(upstream))
        connection.scheduleFlush()
        shutdown()
        connection.closeAfterFlush()
    }

    /// Frees the destination side. Called by the connection when it closes.
    func shutdown() {
        if let upstream {
            bufferevent_free(upstream)
            self.upstream = nil
        }
    }
}

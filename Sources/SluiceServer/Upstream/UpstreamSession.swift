import CCurl
import CLibEvent
import CShims
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// libcurl's multi-socket API driven by one worker's `event_base`: Alamofire's `Session`,
/// one per worker, with that worker's upstream connection pool.
///
/// The loop's side of the contract is built to cost no system call per request on a pooled
/// connection (BENCHMARKS.md has the counts):
/// - **Sockets stay registered.** Each socket libcurl opens gets one read and one write event
///   for its whole life (`SocketWatch`), not one per interest change. When libcurl stops
///   watching a socket (its transfer ended and the connection went back to the pool), the
///   read event stays armed: a pooled connection's next request then arms nothing, and an
///   origin that closes an idle connection is noticed. libcurl's close-socket callback
///   (set on every handle) ends the registration before the descriptor is closed, so a
///   reused descriptor number never meets a stale one.
/// - **libcurl's zero-timeout polls are answered from what the loop knows**
///   (`sluice_socket_set_quiet` in CShims): a socket whose read event has reported nothing
///   since libcurl last read it is "quiet".
/// - **A zero timeout runs in the same loop pass** (`LoopTimer.activate()`), not after
///   another trip through `epoll_wait`.
///
/// Threading: created on the main thread before its worker starts, then owned by the
/// worker's event-loop thread; every method and callback runs there. The share handle it
/// uses (DNS cache, TLS sessions) is the only state shared with other workers, behind
/// curl's lock callbacks in CShims. Lifetimes across the C boundary: every pointer handed
/// to libcurl (`self`) is unretained, and so is the owner of each loop event (`self`, each
/// `SocketWatch`); the session outlives its multi (freed in `shutdown()`), and a watch lives
/// in `watches` until its socket closes, which drops its events.
final class UpstreamSession {
    let base: OpaquePointer
    let multi: UnsafeMutableRawPointer
    /// The server's share handle; nil when libcurl could not make one (every handle then keeps
    /// its own DNS cache and TLS sessions).
    let share: UnsafeMutableRawPointer?
    private var timer: LoopTimer<UpstreamSession>!
    /// Easy handles kept for reuse, and how each was left: reset (`curl_easy_reset` keeps its
    /// allocations) or still configured by a plain request (`CurlUpstreamTransfer.isPlain`), whose
    /// options the next plain request overwrites one by one, as libcurl means handles to be
    /// reused. A reset frees the handle's download buffer, which the next transfer then
    /// allocates again (`CURLOPT_BUFFERSIZE`): a configured handle keeps it.
    private var idleHandles: [(handle: UnsafeMutableRawPointer, configured: Bool)] = []
    private static let maxIdleHandles = 128
    /// Response-head collectors kept for reuse, with their buffers' capacity.
    private var headCollectors: [ResponseHeadCollector] = []
    /// The watch of every open libcurl socket, by descriptor.
    private var watches: [SocketWatch?] = []
    private var isShutDown = false
    /// True while the timer's socket action runs: a zero timeout asked for then waits for the
    /// next loop pass (through `epoll_wait`), so libcurl can never keep the loop from I/O.
    private var inTimerAction = false

    /// The loop's registration of one libcurl socket, from its first watch to its close.
    final class SocketWatch {
        let fd: Int32
        var readEvent: SocketEvent<SocketWatch>!
        var writeEvent: SocketEvent<SocketWatch>!
        var readArmed = false
        var writeArmed = false
        /// libcurl's current interest (`CURL_POLL_IN`/`OUT` bits; 0 after `CURL_POLL_REMOVE`).
        var wants: Int32 = 0
        /// The easy handle that last asked for `wants` (see `abortConnection(of:)`).
        var easy: UnsafeMutableRawPointer?
        /// The read event has reported nothing since libcurl last read the socket (and stays
        /// armed while this is true): libcurl's poll of it may be answered "nothing".
        /// The session that owns it; nil once its socket is closed.
        unowned(unsafe) var session: UpstreamSession?
        var quiet = false {
            didSet { if quiet != oldValue { sluice_socket_set_quiet(fd, quiet ? 1 : 0) } }
        }
        /// Never quiet: libcurl reads a parent proxy's answer to `CONNECT` only after its
        /// zero-timeout poll says the socket is readable, and that poll runs inside the very
        /// action the read event started.
        var pollsForReal = false
        init(fd: Int32) { self.fd = fd }

        /// The socket closes: its events go first, so a reused descriptor number never meets
        /// them.
        func end() {
            quiet = false
            readEvent = nil
            writeEvent = nil
            session = nil
        }
    }

    init(base: OpaquePointer, share: CurlShare, limits: UpstreamPoolLimits = UpstreamPoolLimits()) {
        self.base = base
        self.share = share.handle()
        multi = sluice_curl_multi_init()
        let me = Unmanaged.passUnretained(self).toOpaque()
        timer = LoopTimer(on: base, owner: self) { session in
            session.inTimerAction = true
            session.socketAction(fd: CURL_SOCKET_TIMEOUT, flags: 0)
            session.inTimerAction = false
        }
        sluice_multi_setopt_ptr(multi, CURLMOPT_SOCKETDATA, me)
        sluice_multi_setopt_ptr(multi, CURLMOPT_TIMERDATA, me)
        sluice_multi_setopt_socket_cb(multi) { easy, fd, what, userp, _ in
            let session = Unmanaged<UpstreamSession>.fromOpaque(userp!).takeUnretainedValue()
            session.watch(fd: fd, what: what, easy: easy)
            return 0
        }
        sluice_multi_setopt_timer_cb(multi) { _, timeoutMs, userp in
            let session = Unmanaged<UpstreamSession>.fromOpaque(userp!).takeUnretainedValue()
            session.setTimer(milliseconds: timeoutMs)
            return 0
        }
        // Keep enough idle upstream connections for a busy worker.
        sluice_multi_setopt_long(multi, CURLMOPT_MAXCONNECTS, 1024)
        // The server's `upstream:` limits (Features/HTTP2.swift), per worker as the pool is.
        // HTTP/2 multiplexing itself is libcurl's default (CURLPIPE_MULTIPLEX); set it anyway.
        sluice_multi_setopt_long(multi, CURLMOPT_PIPELINING, Int(CURLPIPE_MULTIPLEX))
        sluice_multi_setopt_long(multi, CURLMOPT_MAX_HOST_CONNECTIONS, limits.maxConnectionsPerHost)
        sluice_multi_setopt_long(multi, CURLMOPT_MAX_CONCURRENT_STREAMS, limits.maxStreams)
    }

    /// A session whose worker never ran (its start failed) frees libcurl's state here: it has
    /// no sockets, so no close-socket callback reaches the object being freed. One that ran
    /// was shut down by its worker already.
    deinit { shutdown() }

    /// Closes the pool and frees libcurl's state; called once by the worker when its loop
    /// has ended and every transfer is detached.
    /// The multi handle exists and takes transfers (until `shutdown()`).
    var isUsable: Bool { !isShutDown }

    func shutdown() {
        guard !isShutDown else { return }
        isShutDown = true
        for idle in idleHandles { sluice_curl_easy_cleanup(idle.handle) }
        idleHandles.removeAll()
        sluice_curl_multi_cleanup(multi)  // closes pooled connections through closeSocket
        // A socket libcurl closed without the close-socket callback (after a CURL_POLL_REMOVE)
        // leaves its watch here: its events are freed now, before the worker frees the loop.
        for case let w? in watches { w.end() }
        watches.removeAll()
        timer = nil
    }

    /// An easy handle from the pool (or a new one). For a `plain` request it may come still
    /// configured by the previous plain request (`configured`); otherwise it is reset, with
    /// what every transfer of the session shares (`curl_easy_reset` clears it): the share
    /// handle, no signals, no proxy taken from the process's environment (libcurl reads
    /// `http_proxy` & co. unless told a proxy: with `HTTP_PROXY` pointing at Sluice itself,
    /// every request would loop), and the close-socket hook.
    func makeHandle(plain: Bool = false) -> (handle: UnsafeMutableRawPointer, configured: Bool) {
        let h: UnsafeMutableRawPointer
        if let idle = idleHandles.popLast() {
            if idle.configured && plain { return (idle.handle, true) }
            if idle.configured { sluice_curl_easy_reset(idle.handle) }
            h = idle.handle
        } else {
            h = sluice_curl_easy_init()!
        }
        sluice_easy_setopt_ptr(h, CURLOPT_SHARE, share)
        sluice_easy_setopt_long(h, CURLOPT_NOSIGNAL, 1)
        sluice_easy_setopt_str(h, CURLOPT_PROXY, "")
        sluice_easy_setopt_ptr(h, CURLOPT_CLOSESOCKETDATA, Unmanaged.passUnretained(self).toOpaque())
        sluice_easy_setopt_closesocket_cb(h) { clientp, fd in
            Unmanaged<UpstreamSession>.fromOpaque(clientp!).takeUnretainedValue().closeSocket(fd)
        }
        return (h, false)
    }

    /// A response-head collector with reusable storage, for one try.
    func takeHeadCollector() -> ResponseHeadCollector {
        headCollectors.popLast() ?? ResponseHeadCollector()
    }

    /// Takes back a try's collector (leaving an empty one in its place).
    func recycle(_ collector: inout ResponseHeadCollector) {
        guard headCollectors.count < Self.maxIdleHandles else { return }
        var taken = ResponseHeadCollector()
        swap(&taken, &collector)
        taken.reset()
        headCollectors.append(taken)
    }

    func start(_ handle: UnsafeMutableRawPointer) {
        sluice_curl_multi_add_handle(multi, handle)
    }

    /// Detaches a handle (finished or cancelled) and keeps it for reuse: as configured when
    /// it carried a plain request, reset otherwise (nothing of a TLS, upload or credentialed
    /// request's options may reach the next request). Must not be called from inside a curl
    /// callback.
    func finish(_ handle: UnsafeMutableRawPointer, plain: Bool = false) {
        sluice_curl_multi_remove_handle(multi, handle)
        if idleHandles.count < Self.maxIdleHandles {
            if !plain { sluice_curl_easy_reset(handle) }
            idleHandles.append((handle, plain))
        } else {
            sluice_curl_easy_cleanup(handle)
        }
    }

    /// Makes the connection `handle` is transferring on end with a reset when libcurl closes
    /// it (call before `finish` for a transfer abandoned midway). A FIN would queue behind
    /// unsent request body an origin is not reading: it would never learn that the upload
    /// stopped, and the connection would sit in FIN_WAIT1 holding its buffers.
    ///
    /// Not on an HTTP/2 connection: the transfer is one stream of it, which libcurl ends with
    /// `RST_STREAM` when the handle is removed; the connection carries other streams.
    /// `multiplexed`: the try was sent with prior knowledge (HTTP/2 on plain http, which no
    /// handshake tells); over TLS the ALPN answer tells (`sluice_easy_speaks_h2`).
    func abortConnection(of handle: UnsafeMutableRawPointer, multiplexed: Bool = false) {
        if multiplexed || sluice_easy_speaks_h2(handle) != 0 { return }
        for case let w? in watches where w.easy == handle && w.wants != 0 {
            var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
            setsockopt(w.fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
        }
    }

    /// Detaches and destroys a handle, closing any connection it still owns (a CONNECT_ONLY
    /// connection is owned by its handle, never pooled).
    func discard(_ handle: UnsafeMutableRawPointer) {
        sluice_curl_multi_remove_handle(multi, handle)
        sluice_curl_easy_cleanup(handle)
    }

    // MARK: sockets

    /// Marks a socket just opened to a parent proxy (`SocketWatch.pollsForReal`); called from
    /// libcurl's open-socket callback.
    func connectsToParentProxy(_ fd: Int32) {
        guard fd >= 0 else { return }
        watchOf(fd).pollsForReal = true
    }

    private func watch(fd: curl_socket_t, what: Int32, easy: UnsafeMutableRawPointer?) {
        guard fd >= 0 else { return }
        if what == CURL_POLL_REMOVE {
            guard Int(fd) < watches.count, let w = watches[Int(fd)] else { return }
            w.wants = 0
            arm(w)
            return
        }
        let w = watchOf(fd)
        w.wants = what & (CURL_POLL_IN | CURL_POLL_OUT)
        w.easy = easy
        arm(w)
    }

    private func watchOf(_ fd: Int32) -> SocketWatch {
        let i = Int(fd)
        if i < watches.count, let w = watches[i] { return w }
        if i >= watches.count { watches.append(contentsOf: repeatElement(nil, count: i + 1 - watches.count)) }
        let w = SocketWatch(fd: fd)
        w.readEvent = SocketEvent(on: base, fd: fd, .read, owner: w) { w, _ in w.session?.readable(w) }
        w.writeEvent = SocketEvent(on: base, fd: fd, .write, owner: w) { w, _ in w.session?.writable(w) }
        w.session = self
        watches[i] = w
        return w
    }

    /// Registers exactly what the watch needs: reading while libcurl wants it or while the
    /// socket is quiet (the pooled connection's watch), writing while libcurl wants it.
    private func arm(_ w: SocketWatch) {
        let read = w.wants & CURL_POLL_IN != 0 || w.quiet
        let write = w.wants & CURL_POLL_OUT != 0
        if read != w.readArmed {
            w.readArmed = read
            if read { w.readEvent.arm() } else { w.readEvent.stop() }
        }
        if write != w.writeArmed {
            w.writeArmed = write
            if write { w.writeEvent.arm() } else { w.writeEvent.stop() }
        }
    }

    fileprivate func readable(_ w: SocketWatch) {
        if w.wants & CURL_POLL_IN != 0 {
            // libcurl reads it now; until the loop reports it again, there is nothing new
            // (libcurl's "more pending?" poll after a read is answered without a system call).
            // Except on a socket to a parent proxy (`pollsForReal`).
            w.quiet = !w.pollsForReal
            socketAction(fd: w.fd, flags: CURL_CSELECT_IN)
        } else {
            // A pooled connection the origin closed (or wrote to): libcurl's next poll of it
            // must see that for real, and the loop stops reporting it.
            w.quiet = false
            arm(w)
        }
    }

    fileprivate func writable(_ w: SocketWatch) {
        if w.wants & CURL_POLL_OUT != 0 {
            // While libcurl also reads (an upload that may meet an early answer), it is told
            // the socket may be readable too, so it reads before it writes, as it does when a
            // single event reports both: an origin that answered and closed must not be met
            // with a write first (EPIPE, and a 502 instead of its answer). A wrong "readable"
            // costs one recv that finds nothing.
            let flags = w.wants & CURL_POLL_IN != 0 ? CURL_CSELECT_OUT | CURL_CSELECT_IN : CURL_CSELECT_OUT
            socketAction(fd: w.fd, flags: flags)
        } else {
            arm(w)
        }
    }

    /// libcurl closes a socket: the registration ends before the descriptor does.
    private func closeSocket(_ fd: curl_socket_t) -> Int32 {
        if fd >= 0, Int(fd) < watches.count, let w = watches[Int(fd)] {
            w.end()
            watches[Int(fd)] = nil
        }
        return Glibc.close(fd)
    }

    // MARK: timer

    private func setTimer(milliseconds: Int) {
        timer.stop()
        if milliseconds < 0 { return }
        if milliseconds == 0 && !inTimerAction {
            // Run in this loop pass, after the callback that asked (never inside libcurl).
            timer.activate()
            return
        }
        timer.arm(milliseconds: milliseconds)
    }

    private func socketAction(fd: curl_socket_t, flags: Int32) {
        var running: Int32 = 0
        sluice_curl_multi_socket_action(multi, fd, flags, &running)
        drainMessages()
    }

    /// Hands every finished transfer its result. Runs outside curl callbacks, so the
    /// transfers may remove their handles and start new ones.
    private func drainMessages() {
        var pending: Int32 = 0
        while let msg = sluice_curl_multi_info_read(multi, &pending) {
            guard msg.pointee.msg == CURLMSG_DONE, let easy = msg.pointee.easy_handle else { continue }
            let result = msg.pointee.data.result
            var priv: UnsafeMutableRawPointer?
            sluice_easy_getinfo_ptr(easy, CURLINFO_PRIVATE, &priv)
            guard let priv else { continue }
            Unmanaged<CurlTransfer>.fromOpaque(priv).takeUnretainedValue().curlDone(result)
        }
    }
}

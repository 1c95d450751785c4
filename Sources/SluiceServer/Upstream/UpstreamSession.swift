import CCurl
import CLibEvent
import CShims
import SluiceCore

/// libcurl's multi-socket API driven by one worker's `event_base`: Alamofire's `Session`,
/// one per worker, with that worker's upstream connection pool.
///
/// Threading: created on the main thread before its worker starts, then owned by the
/// worker's event-loop thread; every method and callback runs there. The share handle it
/// uses (DNS cache, TLS sessions) is the only state shared with other workers, behind
/// curl's lock callbacks in CShims.
final class UpstreamSession {
    let base: OpaquePointer
    let multi: UnsafeMutableRawPointer
    let share: UnsafeMutableRawPointer
    private var timer: OpaquePointer!
    /// Easy handles kept for reuse: `curl_easy_reset` keeps their allocations.
    private var idleHandles: [UnsafeMutableRawPointer] = []
    private static let maxIdleHandles = 256

    /// One libevent watch per socket curl asks us to watch; handed to curl as its socketp.
    final class SocketWatch {
        var event: OpaquePointer?
        let fd: Int32
        init(fd: Int32) { self.fd = fd }
    }

    init(base: OpaquePointer, share: UnsafeMutableRawPointer) {
        self.base = base
        self.share = share
        multi = curl_multi_init()
        let me = Unmanaged.passUnretained(self).toOpaque()
        timer = event_new(base, -1, 0, { _, _, arg in
            let session = Unmanaged<UpstreamSession>.fromOpaque(arg!).takeUnretainedValue()
            session.socketAction(fd: CURL_SOCKET_TIMEOUT, flags: 0)
        }, me)
        sluice_multi_setopt_ptr(multi, CURLMOPT_SOCKETDATA, me)
        sluice_multi_setopt_ptr(multi, CURLMOPT_TIMERDATA, me)
        sluice_multi_setopt_socket_cb(multi) { _, fd, what, userp, socketp in
            let session = Unmanaged<UpstreamSession>.fromOpaque(userp!).takeUnretainedValue()
            session.watch(fd: fd, what: what, socketp: socketp)
            return 0
        }
        sluice_multi_setopt_timer_cb(multi) { _, timeoutMs, userp in
            let session = Unmanaged<UpstreamSession>.fromOpaque(userp!).takeUnretainedValue()
            session.setTimer(milliseconds: timeoutMs)
            return 0
        }
        // Keep enough idle upstream connections for a busy worker.
        sluice_multi_setopt_long(multi, CURLMOPT_MAXCONNECTS, 1024)
    }

    deinit {
        for h in idleHandles { curl_easy_cleanup(h) }
        curl_multi_cleanup(multi)
        event_free(timer)
    }

    /// An easy handle, fresh or reset from the pool.
    func makeHandle() -> UnsafeMutableRawPointer {
        if let h = idleHandles.popLast() { return h }
        return curl_easy_init()
    }

    func start(_ handle: UnsafeMutableRawPointer) {
        curl_multi_add_handle(multi, handle)
    }

    /// Detaches a handle (finished or cancelled) and keeps it for reuse. Must not be called
    /// from inside a curl callback.
    func finish(_ handle: UnsafeMutableRawPointer) {
        curl_multi_remove_handle(multi, handle)
        if idleHandles.count < Self.maxIdleHandles {
            curl_easy_reset(handle)
            idleHandles.append(handle)
        } else {
            curl_easy_cleanup(handle)
        }
    }

    /// Detaches and destroys a handle, closing any connection it still owns (a CONNECT_ONLY
    /// connection is owned by its handle, never pooled).
    func discard(_ handle: UnsafeMutableRawPointer) {
        curl_multi_remove_handle(multi, handle)
        curl_easy_cleanup(handle)
    }

    private func watch(fd: curl_socket_t, what: Int32, socketp: UnsafeMutableRawPointer?) {
        if what == CURL_POLL_REMOVE {
            if let socketp {
                let w = Unmanaged<SocketWatch>.fromOpaque(socketp).takeRetainedValue()
                if let ev = w.event { event_free(ev) }
                curl_multi_assign(multi, fd, nil)
            }
            return
        }
        let w: SocketWatch
        if let socketp {
            w = Unmanaged<SocketWatch>.fromOpaque(socketp).takeUnretainedValue()
            if let ev = w.event { event_del(ev); event_free(ev) }
        } else {
            w = SocketWatch(fd: fd)
            curl_multi_assign(multi, fd, Unmanaged.passRetained(w).toOpaque())
        }
        var flags = Int16(EV_PERSIST)
        if what & CURL_POLL_IN != 0 { flags |= Int16(EV_READ) }
        if what & CURL_POLL_OUT != 0 { flags |= Int16(EV_WRITE) }
        w.event = event_new(base, fd, flags, { fd, events, arg in
            let session = Unmanaged<UpstreamSession>.fromOpaque(arg!).takeUnretainedValue()
            var action: Int32 = 0
            if events & Int16(EV_READ) != 0 { action |= CURL_CSELECT_IN }
            if events & Int16(EV_WRITE) != 0 { action |= CURL_CSELECT_OUT }
            session.socketAction(fd: fd, flags: action)
        }, Unmanaged.passUnretained(self).toOpaque())
        event_add(w.event, nil)
    }

    private func setTimer(milliseconds: Int) {
        if milliseconds < 0 {
            event_del(timer)
            return
        }
        var tv = timeval(tv_sec: milliseconds / 1000, tv_usec: (milliseconds % 1000) * 1000)
        event_add(timer, &tv)
    }

    private func socketAction(fd: curl_socket_t, flags: Int32) {
        var running: Int32 = 0
        curl_multi_socket_action(multi, fd, flags, &running)
        drainMessages()
    }

    /// Hands every finished transfer its result. Runs outside curl callbacks, so the
    /// transfers may remove their handles and start new ones.
    private func drainMessages() {
        var pending: Int32 = 0
        while let msg = curl_multi_info_read(multi, &pending) {
            guard msg.pointee.msg == CURLMSG_DONE, let easy = msg.pointee.easy_handle else { continue }
            let result = msg.pointee.data.result
            var priv: UnsafeMutableRawPointer?
            sluice_easy_getinfo_ptr(easy, CURLINFO_PRIVATE, &priv)
            guard let priv else { continue }
            Unmanaged<CurlTransfer>.fromOpaque(priv).takeUnretainedValue().curlDone(result)
        }
    }
}

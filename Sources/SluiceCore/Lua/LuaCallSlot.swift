import CLua

/// What one call in flight owns on a state: its coroutine, the `req` and `res` userdata the
/// script is given (each naming this slot by index), and the Swift values they read and edit.
/// Slots are made on demand and reused; one is enough while calls never overlap (a call that
/// yields for `sluice.http` will hold its slot while others run).
///
/// Threading: owned by its `LuaState`, on that state's thread. Its fields are read and written
/// on every call by the engine and by the Swift functions Lua calls, never with an access
/// left open across `lua_resume`: they skip the runtime's exclusivity checks (about 1,400
/// instructions a call when checked, by callgrind).
final class LuaCallSlot {
    /// Which hook the slot's call runs: `req` answers only during `.request`, `res` only
    /// during `.response`, so a `req` kept past its call cannot read another call's request.
    enum Phase { case idle, request, response, log }

    let index: Int32
    @exclusivity(unchecked) var thread: OpaquePointer?
    @exclusivity(unchecked) var threadRef = LUA_NOREF
    let requestRef: Int32
    let responseRef: Int32

    @exclusivity(unchecked) var phase = Phase.idle
    /// The request the call reads and edits: the slot's own, or the caller's view itself,
    /// lent by address for a call that runs at once on it (`lending`): no copy in and out.
    var request: LuaRequestView {
        unsafeAddress { UnsafePointer(requestAddress) }
        unsafeMutableAddress { requestAddress }
    }
    /// Where `request` is: `ownRequest`, or a lent view for the length of one call.
    @exclusivity(unchecked) private var requestAddress: UnsafeMutablePointer<LuaRequestView>
    private let ownRequest: UnsafeMutablePointer<LuaRequestView>
    @exclusivity(unchecked) var response = LuaCallSlot.noResponse
    @exclusivity(unchecked) var limits = LuaLimits.default
    @exclusivity(unchecked) var requestID: UInt64 = 0
    @exclusivity(unchecked) var respond: LuaResponseView?
    @exclusivity(unchecked) var retry = false
    /// Set when a body was refused for `limits.body`: the call's failure is then that limit.
    @exclusivity(unchecked) var bodyRefused = false
    /// `lua_resume`'s status for the call (whether its coroutine can be reused).
    @exclusivity(unchecked) var lastStatus: Int32 = 0
    /// The call's wait, for a call that may wait (`LuaExchange.onRequest(_:waitingWith:…)`).
    @exclusivity(unchecked) var wait: LuaWait?
    /// Set when the call's message is its caller's (lent by `lending`, or gone back by a
    /// swap that left the slot's empty one in its place): `end` has nothing to forget.
    @exclusivity(unchecked) var messageReturned = false

    private static let noRequest = LuaRequestView(method: "", path: "/")
    private static let noResponse = LuaResponseView(status: 0)

    /// The addresses of the slot's `req`, `res`, `req.headers` and `res.headers` userdata
    /// (`LuaMessageAPI.Role` order): how a Swift function checks its `self` (a tuple: every
    /// header call reads one, and an array's read cost a bounds check and a retain).
    let userdata: (UnsafeMutableRawPointer, UnsafeMutableRawPointer, UnsafeMutableRawPointer, UnsafeMutableRawPointer)

    init(
        index: Int32, requestRef: Int32, responseRef: Int32,
        userdata: (UnsafeMutableRawPointer, UnsafeMutableRawPointer, UnsafeMutableRawPointer, UnsafeMutableRawPointer)
    ) {
        self.index = index
        self.requestRef = requestRef
        self.responseRef = responseRef
        self.userdata = userdata
        ownRequest = .allocate(capacity: 1)
        ownRequest.initialize(to: Self.noRequest)
        requestAddress = ownRequest
    }

    deinit {
        ownRequest.deinitialize(count: 1)
        ownRequest.deallocate()
    }

    /// Runs `body` with `view` as the call's request, edited where it is: the caller keeps it
    /// (and every edit, whatever the call did) once `body` returns. Only for a call that
    /// never waits: the address is valid for `body`'s length alone.
    func lending(_ view: inout LuaRequestView, _ body: () -> Void) {
        withUnsafeMutablePointer(to: &view) { lent in
            requestAddress = lent
            body()
            requestAddress = ownRequest
        }
    }

    func begin(_ phase: Phase, limits: LuaLimits, requestID: UInt64) {
        self.phase = phase
        self.limits = limits
        self.requestID = requestID
    }

    /// Forgets the call's values (the slot keeps no message alive between calls).
    func end() {
        switch phase {
        case .request where !messageReturned: request = Self.noRequest
        case .response where !messageReturned: response = Self.noResponse
        case .idle, .log, .request, .response: break
        }
        messageReturned = false
        phase = .idle
        if respond != nil { respond = nil }
        retry = false
        bodyRefused = false
        if wait != nil { wait = nil }
    }
}

import CLibEvent
import Testing

@testable import SluiceServer

#if canImport(Glibc)
    import Glibc
#endif

/// `ClientSocket`'s plain reads on a real TCP connection over loopback.
@Suite struct ClientSocketTests {
    struct SocketFailure: Error {}

    /// What the socket told its owner.
    final class Owner: ClientSocketOwner {
        unowned(unsafe) var socket: ClientSocket?
        var bytes = 0
        var closed = false
        var endedWithError = false

        func socketReadable() {
            guard let socket else { return }
            let n = evbuffer_get_length(socket.input)
            bytes += n
            evbuffer_drain(socket.input, n)
        }

        func socketDrained() {}

        func socketClosed() {
            closed = true
            endedWithError = socket?.endedWithError ?? false
        }
    }

    /// A connected pair on 127.0.0.1: (the accepted side, the connecting side, non-blocking).
    static func pair() throws -> (server: Int32, client: Int32) {
        let listener = socket(AF_INET, Int32(Glibc.SOCK_STREAM.rawValue), 0)
        defer { Glibc.close(listener) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        try withUnsafeMutablePointer(to: &address) { a in
            try a.withMemoryRebound(to: sockaddr.self, capacity: 1) { s in
                guard bind(listener, s, length) == 0, listen(listener, 1) == 0, getsockname(listener, s, &length) == 0
                else { throw SocketFailure() }
            }
        }
        let client = socket(AF_INET, Int32(Glibc.SOCK_STREAM.rawValue), 0)
        try withUnsafePointer(to: &address) { a in
            try a.withMemoryRebound(to: sockaddr.self, capacity: 1) { s in
                guard connect(client, s, length) == 0 else { throw SocketFailure() }
            }
        }
        let server = accept(listener, nil, nil)
        _ = fcntl(client, F_SETFL, fcntl(client, F_GETFL) | O_NONBLOCK)
        return (server, client)
    }

    /// Reads, through a `ClientSocket` on a real loop, what the peer sent before it closed —
    /// with a reset (`SO_LINGER` 0) or a plain close: exactly one extent's worth (`smallRead`),
    /// so the first `recv` fills the extent and the read into the spill meets the end.
    static func readUntilTheEnd(reset: Bool) throws -> Owner {
        let f = LoopEventTests.Fixture()
        defer { f.close() }
        let (server, client) = try Self.pair()
        let payload = [UInt8](repeating: 0x61, count: ClientSocket.smallRead)
        #expect(payload.withUnsafeBytes { send(server, $0.baseAddress, $0.count, 0) } == payload.count)
        if reset {
            var option = linger(l_onoff: 1, l_linger: 0)
            setsockopt(server, SOL_SOCKET, SO_LINGER, &option, socklen_t(MemoryLayout<linger>.size))
        }
        Glibc.close(server)
        usleep(50_000)  // the bytes and the end are in the client's queue before the first read

        let spill = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
        defer { spill.deallocate() }
        let owner = Owner()
        var socket: ClientSocket? = ClientSocket(base: f.base, fd: client, spill: spill)
        owner.socket = socket
        socket?.owner = owner
        f.spin(milliseconds: 2000) { owner.closed }
        socket?.close()
        socket = nil
        #expect(owner.bytes == payload.count)
        #expect(owner.closed)
        return owner
    }

    /// A reset met by the read into the spill: reading it clears it from the socket. The bytes
    /// reach the owner, then the end, as an error; had the spill's error been dropped, the next
    /// read would have seen a clean end, and a body framed by the connection's end would have
    /// passed for complete.
    @Test func aResetMetByTheSpillsReadIsAnErrorAfterTheBytes() throws {
        #expect(try Self.readUntilTheEnd(reset: true).endedWithError)
    }

    /// The same bytes and a plain close (FIN): a clean end after the bytes.
    @Test func aCloseMetByTheSpillsReadIsACleanEndAfterTheBytes() throws {
        #expect(try !Self.readUntilTheEnd(reset: false).endedWithError)
    }
}

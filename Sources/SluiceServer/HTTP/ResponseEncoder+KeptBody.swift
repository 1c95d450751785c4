import CLibEvent

extension ResponseEncoder {
    /// A response whose body was kept whole for a script (`read_response_body`), for the
    /// client: `head` as the scripts left it, framed by the length of `body` — the origin's
    /// `Content-Length` and `Transfer-Encoding` replaced (`ResponseHeadCollector.reframed`), its
    /// hop-by-hop fields dropped and `viaLine` added as for any forwarded head
    /// (`forwardedHead`) — then `body` (none after a `HEAD`, a `204` or a `304`). Writes
    /// nothing when the head cannot be forwarded. `replacedBody`: a script's body, not the
    /// origin's: the fields about the origin's bytes go, a strong `ETag` is made weak
    /// (`ResponseHeadCollector.reframed`).
    static func keptBodyAnswer(
        _ head: ResponseHeadCollector, body: [UInt8], replacedBody: Bool = false, isHeadRequest: Bool,
        clientMinorVersion: Int, keepAlive: Bool, viaLine: [UInt8], into output: OpaquePointer
    ) throws(InvalidResponse) {
        let framing = try forwardedHead(
            head.reframed(length: body.count, replacedBody: replacedBody), isHeadRequest: isHeadRequest,
            clientMinorVersion: clientMinorVersion,
            keepAlive: keepAlive, viaLine: viaLine, into: output)
        guard framing == .length else { return }
        body.withUnsafeBytes { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
    }
}

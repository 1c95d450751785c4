import SluiceCore

/// The request body a try needs before it starts: a chunked body's first chunk-size line is
/// validated first (so a malformed body never opens an upstream connection), and a body that
/// every try must be able to send again (`retry.buffer_limit`; a redirect or a credentials
/// challenge that resends it) is read whole first. Bodies the adapters encode (`deflate`)
/// get their encoders here. An adapter that reads the body (a signer, `max_body`) has it read
/// whole too, or the request refused with `413` when it is larger. The connection reads; this
/// stage says what it waits for.
enum RequestBodyStage: RequestStage {
    static var name: String { "request_body" }

    static func enter(_ exchange: Exchange, _ services: any StageServices) -> StageVerdict {
        if let model = exchange.model, !model.bodyEncoders.isEmpty {
            exchange.body.setEncoders(model.bodyEncoders.map { $0.makeEncoder() })
        }
        if let reader = exchange.policy.bodyReader, exchange.head.hasBody {
            // An adapter reads the body (a signer): all of it, before the first try, within
            // `max_body`; a declared length past it is refused before a byte is read.
            if case .length(let n) = exchange.head.framing, n > exchange.policy.maxBody {
                return .respond(.bodyTooLargeForAdapter(adapter: reader, limit: exchange.policy.maxBody))
            }
            return .wait(.requestBody(.whole))
        }
        switch exchange.head.framing {
        case .none:
            return .proceed
        case .chunked:
            return .wait(.requestBody(.start))
        case .length(let n):
            return exchange.inspect({ $0.readsBodyWhole(length: n) }) ? .wait(.requestBody(.whole)) : .proceed
        }
    }
}

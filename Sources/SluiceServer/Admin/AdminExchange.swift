import SluiceCore

/// One in-flight exchange as the admin API shows it (`docs/admin-api.yaml`, `Exchange`).
struct AdminExchange: Sendable, Encodable {
    let id: UInt64
    let requestId: String
    let worker: Int
    let client: String
    let method: String
    let url: String
    let policy: String
    let host: String
    let state: String
    let attempt: Int
    let status: Int
    let bytesIn: Int64
    let bytesOut: Int64
    let ageMilliseconds: Int

    /// `exchange` as it is now; `state` names what it waits for.
    init(_ exchange: Exchange, state: String, worker index: Int) {
        let summary = exchange.summary
        id = summary.id
        requestId = summary.requestId ?? ""
        worker = index
        client = summary.client
        method = summary.method
        url = exchange.pipeline.redactor.url(summary.url)
        policy = summary.policy
        host = exchange.policyHost
        self.state = state
        attempt = summary.attempts
        status = summary.status
        bytesIn = summary.bytesIn
        bytesOut = summary.bytesOut
        ageMilliseconds = exchange.inspect { $0.elapsed }
    }

    enum CodingKeys: String, CodingKey {
        case id, worker, client, method, url, policy, host, state, attempt, status
        case requestId = "request_id"
        case bytesIn = "bytes_in"
        case bytesOut = "bytes_out"
        case ageMilliseconds = "age_ms"
    }
}

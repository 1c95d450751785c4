import SluiceCore

/// `validate`, `retry`, `redirect`, `credentials` and oauth2's `refresh_on` on the response's
/// way back (docs/configuration.md): the `ExchangeMachine` decides about the final head — pass
/// it on, drain it and try again (a status the policy retries, a failed validation, a pause
/// the origin asked for, a script's `res:retry()`), or follow a redirect — asked only for the fields its decision for
/// that status reads.
enum ResponseDecisionStage: ResponseStage {
    static var name: String { "decision" }

    static func head(
        _ response: inout ResponseHeadContext, _ exchange: Exchange, _ services: any StageServices
    )
        -> ResponseVerdict
    {
        let head = machineHead(response.response.collected, exchange)
        let answer =
            response.heldByOrigin
            ? exchange.machine.heldByOrigin(head, canResendBody: response.canResendBody)
            : response.scriptRetry
                ? exchange.machine.scriptRetried(head, canResendBody: response.canResendBody)
                : exchange.machine.responseHead(head, canResendBody: response.canResendBody)
        exchange.report(answer.reports)
        switch answer.command {
        case .discardResponse?: return .discard
        case .checkRedirect(let next)?: return .follow(next)
        case .sendResponse?, nil: return .proceed
        }
    }

    /// A final response head as the machine sees it: the status, and only the fields its
    /// decision for that status reads.
    static func machineHead(_ head: ResponseHeadCollector, _ exchange: Exchange) -> ExchangeMachine.ResponseHead {
        let fields = exchange.inspect { $0.responseFields(for: head.status) }
        return ExchangeMachine.ResponseHead(
            status: head.status,
            retryAfter: fields.contains(.retryAfter) ? head.value("retry-after") : nil,
            contentType: fields.contains(.contentType) ? head.value("content-type") : nil,
            location: fields.contains(.location) ? head.value("location") : nil)
    }
}

import Testing

@testable import SluiceCore

/// How an exchange's record reaches monitors (`EventMonitor.exchangeEnded`): lent to the
/// monitors that implement it, handed as an event to those that do not, by its kind.
@Suite struct EventMonitorTests {
    final class Recorder: EventMonitor {
        let events: ProxyEvent.Kinds
        var seen: [String] = []
        init(_ events: ProxyEvent.Kinds) { self.events = events }
        func handle(_ event: ProxyEvent) {
            switch event {
            case .finished(let s): seen.append("finished \(s.id) \(s.status)")
            case .tunnelClosed(let s): seen.append("tunnelClosed \(s.id)")
            default: seen.append("other")
            }
        }
    }

    /// Implements `exchangeEnded` itself: the record is not copied into an event for it.
    final class Lender: EventMonitor {
        var events: ProxyEvent.Kinds { [.finished, .tunnelClosed] }
        var lent: [UInt64] = []
        var handled = 0
        func handle(_ event: ProxyEvent) { handled += 1 }
        func exchangeEnded(_ summary: ExchangeSummary) { lent.append(summary.id) }
    }

    static func summary(_ id: UInt64, _ outcome: Outcome) -> ExchangeSummary {
        var s = ExchangeSummary(id: id, client: "127.0.0.1", method: "GET", url: "http://a.test/", policy: "default")
        s.status = 200
        s.outcome = outcome
        return s
    }

    @Test func theDefaultHandsTheEventOfTheRecordsKind() {
        let all = Recorder(.all)
        all.exchangeEnded(Self.summary(1, .ok))
        all.exchangeEnded(Self.summary(2, .tunnel))
        #expect(all.seen == ["finished 1 200", "tunnelClosed 2"])
        // A monitor that does not read the kind gets nothing.
        let tries = Recorder(.tryStarted)
        tries.exchangeEnded(Self.summary(3, .ok))
        #expect(tries.seen.isEmpty)
        let tunnels = Recorder(.tunnelClosed)
        tunnels.exchangeEnded(Self.summary(4, .ok))
        tunnels.exchangeEnded(Self.summary(5, .tunnel))
        #expect(tunnels.seen == ["tunnelClosed 5"])
    }

    @Test func theCompositeLendsTheRecordToEachMonitorThatReadsIt() {
        let all = Recorder(.all)
        let tries = Recorder(.tryStarted)
        let lender = Lender()
        let composite = CompositeEventMonitor([all, tries, lender])
        composite.exchangeEnded(Self.summary(7, .ok))
        composite.exchangeEnded(Self.summary(8, .tunnel))
        #expect(all.seen == ["finished 7 200", "tunnelClosed 8"])
        #expect(tries.seen.isEmpty)
        #expect(lender.lent == [7, 8] && lender.handled == 0)
    }

    /// The machine's `ended` reports the record once, to the closure form as to the events form.
    @Test func theMachineLendsItsRecordOnceAtTheEnd() {
        var machine = ExchangeMachine(
            summary: Self.summary(9, .ok), policy: policy(), target: origin, defaultPerTryTimeout: 1000,
            monitoring: .events, events: .all)
        var lent: [Outcome] = []
        machine.ended(Outcome.clientAborted, error: String?.none) { lent.append($0.outcome) }
        machine.ended(Outcome.ok, error: String?.none) { lent.append($0.outcome) }
        #expect(lent == [.clientAborted])
        #expect(machine.ended(.ok, error: nil).isEmpty)
    }
}

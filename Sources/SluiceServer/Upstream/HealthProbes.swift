import CLibEvent
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// The probes of `health.probe`: while an origin's circuit is half-open, one `GET probe.path`
/// at a time, as a `SideFetch` — through the same parent proxy (`upstream_proxy`), TLS trust,
/// client certificate and `access.deny` check as the host's requests — whose answer below 500
/// closes the circuit (`CircuitBreaker`). A timer every `tick` ms asks `UpstreamHealth` which
/// probes are due; it runs only while some policy has a probe.
///
/// Threading: one, on worker 0 (so each origin gets one probe per interval however many
/// workers run), touched only on that worker's thread. Its timer holds it
/// unretained: the worker keeps it and drops the timer (`close()`) before its loop ends. A
/// probe in flight keeps itself alive (`SideFetch`) and captures the worker's shared
/// `UpstreamHealth`, not the worker.
final class HealthProbes {
    /// How often due probes are looked for (ms): a probe starts at most this late.
    static let tick = 250
    private unowned let worker: Worker
    private var timer: LoopTimer<HealthProbes>?
    private var armed = false

    init(worker: Worker) {
        self.worker = worker
        timer = LoopTimer(on: worker.base, owner: self, repeating: true) { $0.startDue() }
        update()
    }

    /// Arms the timer when a policy has a probe (at start and after a reload), else stops it.
    func update() {
        let wanted = worker.pipeline.policies.probes
        guard wanted != armed else { return }
        armed = wanted
        if wanted { timer?.arm(milliseconds: Self.tick) } else { timer?.stop() }
    }

    func close() { timer = nil }

    private func startDue() {
        for due in worker.health.probesDue(now: MonotonicClock.milliseconds()) {
            CircuitStage.log(due.change, probe: true)
            guard let probe = due.settings.probe else { continue }
            guard let fleet = worker.fleet else {
                start(due.origin, probe.path, due.settings)
                continue
            }
            // One probe for the whole fleet: the instance that takes the lock sends it; the
            // others wait for its news (their probe counts as failed, for another interval).
            let origin = due.origin
            let settings = due.settings
            fleet.lockTrial(origin.name, milliseconds: probe.interval) { [unowned(unsafe) self] acquired in
                if acquired == false {
                    let answer = self.worker.health.handle(
                        .probeEnded(success: false), for: origin, settings: settings, now: MonotonicClock.milliseconds())
                    CircuitStage.log(answer.change, probe: true)
                    return
                }
                self.start(origin, probe.path, settings)
            }
        }
    }

    private func start(_ origin: UpstreamHealth.Origin, _ path: String, _ settings: Health) {
        let policy = worker.pipeline.policies.match(host: origin.host)
        let health = worker.health
        let fleet = worker.fleet
        let fetch = SideFetch(
            session: worker.session, config: worker.config, policy: policy, url: origin.name + path,
            headers: [("User-Agent", "sluice-health-probe"), ("Via", worker.via)], body: nil,
            reuse: UpstreamTLS.reuse(current: worker.pipeline, exchangeSnapshot: nil)
        ) { result in
            let success: Bool
            switch result {
            case .success(let answer):
                success = answer.status > 0 && answer.status < 500
                if !success { Log.debug("upstream \(origin.name): probe \(path) answered \(answer.status)") }
            case .failure(let error):
                success = false
                Log.debug("upstream \(origin.name): probe \(path) failed: \(error.message)")
            }
            let answer = health.handle(
                .probeEnded(success: success), for: origin, settings: settings,
                now: MonotonicClock.milliseconds())
            CircuitStage.log(answer.change, probe: true)
            if let change = answer.change {
                CircuitStage.tellFleet(change, cooldown: settings.probe?.interval ?? settings.cooldown, fleet)
            }
        }
        fetch.start()
    }
}

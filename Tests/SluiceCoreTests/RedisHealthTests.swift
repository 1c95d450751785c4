import Testing

@testable import SluiceCore

/// When a worker stops asking Redis, and for how long: three failures in a row start a pause
/// (and an episode, reported once), the pause doubles while failures go on, up to 5 s, and one
/// answer ends it all.
@Suite struct RedisHealthTests {
    @Test func threeFailuresPauseAndThePauseGrows() {
        var health = RedisHealth()
        #expect(health.usable(now: 0))
        let first = health.failed(now: 0)
        let second = health.failed(now: 1)
        #expect(!first && !second)
        #expect(health.usable(now: 2), "two failures: still asking")
        let third = health.failed(now: 2)
        #expect(third, "the third starts an episode")
        #expect(!health.usable(now: 50) && health.usable(now: 102))
        // Still failing after the pause: longer pauses, and no second episode.
        for _ in 0..<3 {
            let started = health.failed(now: 200)
            #expect(!started)
        }
        #expect(health.pausedUntil == 400)
        for round in 0..<10 { for _ in 0..<3 { _ = health.failed(now: 1000 * round) } }
        #expect(health.pausedUntil == 9000 + RedisHealth.maxPause, "the pause stops growing at 5 s")
        #expect(health.inEpisode)
    }

    @Test func oneAnswerEndsTheEpisodeAndResetsThePause() {
        var health = RedisHealth()
        for _ in 0..<3 { _ = health.failed(now: 0) }
        let ended = health.succeeded()
        let again = health.succeeded()
        #expect(ended, "the episode ends")
        #expect(!again, "and is reported once")
        #expect(health.usable(now: 0))
        for _ in 0..<3 { _ = health.failed(now: 10) }
        #expect(health.pausedUntil == 10 + RedisHealth.firstPause, "a new episode starts from the first pause")
    }
}

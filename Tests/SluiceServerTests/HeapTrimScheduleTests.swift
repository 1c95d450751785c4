import Testing

@testable import SluiceServer

@Suite struct HeapTrimScheduleTests {
    @Test func idleWorkerHasNoTimer() {
        var schedule = HeapTrimSchedule()
        #expect(!schedule.armed)
        #expect(schedule.check() == .none)
    }

    @Test func firstActivityArmsOnceAndAQuietPeriodTrims() {
        var schedule = HeapTrimSchedule()
        #expect(schedule.activity() == .arm)
        #expect(schedule.activity() == .none)
        #expect(schedule.activity() == .none)
        // Activity since arming: look again one period later.
        #expect(schedule.check() == .arm)
        // Nothing since: trim, once, and disarm.
        #expect(schedule.check() == .trim)
        #expect(!schedule.armed)
        #expect(schedule.check() == .none)
    }

    @Test func steadyLoadNeverTrims() {
        var schedule = HeapTrimSchedule()
        #expect(schedule.activity() == .arm)
        for _ in 0..<100 {
            #expect(schedule.activity() == .none)
            #expect(schedule.check() == .arm)
        }
        #expect(schedule.check() == .trim)
    }

    @Test func activityAfterATrimArmsAgain() {
        var schedule = HeapTrimSchedule()
        _ = schedule.activity()
        _ = schedule.check()
        #expect(schedule.check() == .trim)
        #expect(schedule.activity() == .arm)
        #expect(schedule.check() == .arm)
        #expect(schedule.check() == .trim)
    }
}

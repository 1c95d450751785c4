#ifndef SLUICE_CLOOPCLOCK_H
#define SLUICE_CLOOPCLOCK_H
// The loop clock's per-thread reading (SluiceCore/Core/LoopClock.swift). Swift cannot import
// a thread-local variable, hence the accessors: inlined, each is one load or one store
// relative to the thread pointer.

/// -1 outside a loop event's callback; 0 inside one before anything asked for the time;
/// else the monotonic microseconds first read in that callback.
extern __thread long long sluice_loop_clock;

static inline long long sluice_loop_clock_get(void) { return sluice_loop_clock; }
static inline void sluice_loop_clock_set(long long value) { sluice_loop_clock = value; }

#endif

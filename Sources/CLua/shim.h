#ifndef SLUICE_CLUA_SHIM_H
#define SLUICE_CLUA_SHIM_H
// PUC Lua 5.4 for SluiceCore's scripting engine (Sources/SluiceCore/Lua/), and the few lines of
// C it needs: typed wrappers for the macros Swift cannot import, and the per-state meter (the
// allocator, the count hook and the trampoline through which Lua calls Swift).
//
// Why the meter is C: a Lua error is a longjmp. Jumping over a Swift frame skips its releases
// and leaves its exclusivity accesses open, so no Lua error may be raised while a Swift frame
// is on the stack between the jump and its target. The hook and the allocator therefore raise
// (or refuse) in C only, and a Swift function called from Lua reports an error by returning -1
// with the message on the stack: the trampoline raises it after the Swift frame is gone. While
// Swift runs (`grace` > 0) the allocator never refuses; the trampoline checks the cap when the
// Swift function returns.
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

/// What stopped a call (`sluice_lua_meter.stopped`).
enum {
    SLUICE_LUA_RUNNING = 0,
    SLUICE_LUA_STOPPED_INSTRUCTIONS = 1,
    SLUICE_LUA_STOPPED_MEMORY = 2,
    SLUICE_LUA_STOPPED_WALL = 3,
};

/// The count hook's period: the instruction budget is checked (and the wall clock read) once
/// per this many VM instructions, so budgets are exact to this many instructions.
#define SLUICE_LUA_HOOK_PERIOD 1000

/// The full collections one call may bring about (a refusal's, or one before a buffer is
/// filled): past them a refusal stands. A collection's work grows with the heap, unseen by the
/// count hook; this bounds it per call (with the wall clock, read after each).
#define SLUICE_LUA_MAX_COLLECTIONS 16

/// One state's meter; its address is in every thread's extra space and is the allocator's
/// `ud`. Owned by the Swift `LuaState`, touched only on that state's thread.
typedef struct sluice_lua_meter {
    size_t used;            // bytes allocated now
    size_t limit;           // the cap (limits.memory)
    size_t peak;            // the highest `used` since the call began
    size_t external;        // bytes Swift holds for the call (header edits, a respond's
                            // fields): counted against `limit` with `used` by the trampoline
    int grace;              // > 0 while Swift code runs: the allocator never refuses then
    int stopped;            // SLUICE_LUA_STOPPED_*: sticky until the next call begins
    int refused;            // a refused growth not asked for again yet (`sluice_lua_alloc`),
    void *refused_ptr;      // and that request: its block and sizes
    size_t refused_osize;
    size_t refused_nsize;
    long long periods;      // hook firings since the call began
    long long period_limit; // the instruction budget, in periods
    long long deadline_us;  // the wall-clock budget's end on `clock`'s scale
    long long (*clock)(void *); // NULL: CLOCK_MONOTONIC in microseconds
    void *clock_context;
    void *owner;            // the Swift LuaState (unretained)
    lua_State *running;     // the coroutine a call runs on, while it runs (NULL otherwise)
    int collections;        // full collections the call has brought about (saved across waits)
} sluice_lua_meter;

static inline sluice_lua_meter *sluice_lua_meter_of(lua_State *L) {
    return *(sluice_lua_meter **)lua_getextraspace(L);
}

static inline long long sluice_lua_now_us(sluice_lua_meter *m) {
    if (m->clock) return m->clock(m->clock_context);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/// Raises "chunk:line: <what>" from a hook (C only: see the top of this file).
static int sluice_lua_hook_raise(lua_State *L, lua_Debug *ar, const char *what) {
    if (lua_getinfo(L, "Sl", ar) && ar->currentline > 0)
        lua_pushfstring(L, "%s:%d: %s", ar->short_src, ar->currentline, what);
    else
        lua_pushstring(L, what);
    return lua_error(L);
}

/// Counts `periods` of the call's instruction budget and reads the clock; returns whether the
/// call may go on (no limit has stopped it).
static int sluice_lua_tick(sluice_lua_meter *m, long long periods) {
    if (m->stopped != SLUICE_LUA_RUNNING) return 0;
    m->periods += periods;
    if (m->periods >= m->period_limit)
        m->stopped = SLUICE_LUA_STOPPED_INSTRUCTIONS;
    else if (sluice_lua_now_us(m) >= m->deadline_us)
        m->stopped = SLUICE_LUA_STOPPED_WALL;
    else
        return 1;
    return 0;
}

static void sluice_lua_hook(lua_State *L, lua_Debug *ar);

/// A stop set where no error can be raised (the allocator) is raised at the next VM
/// instruction: the count hook's period drops to 1 on the running coroutine (`lua_sethook`
/// only stores fields; the Lua standalone interpreter calls it from a signal handler).
static inline void sluice_lua_stop_soon(sluice_lua_meter *m) {
    if (m->running) lua_sethook(m->running, sluice_lua_hook, LUA_MASKCOUNT, 1);
}

/// A refused growth stands: the call stops (unless a budget already stopped it).
static inline void sluice_lua_refusal_stands(sluice_lua_meter *m) {
    if (m->stopped == SLUICE_LUA_RUNNING) m->stopped = SLUICE_LUA_STOPPED_MEMORY;
    sluice_lua_stop_soon(m);
}

/// The allocator. Past the cap it refuses growth, and Lua answers a refusal with a full
/// (emergency) collection and the same request again (lmem.c `tryagain`), so garbage not yet
/// collected does not stop a call whose live data fits: the first refusal is held as pending
/// (`refused`), and it stands — the call is stopped — when the request is refused again, or
/// when anything but that request comes next (a lauxlib buffer asks the allocator itself and
/// raises at once, with no collection: loops.h collects before the functions that fill one).
/// Frees come between a refusal and its retry (the collection) and decide nothing. Each
/// collection a refusal brings is charged a period and preceded by a read of the clock, and
/// a call brings about `SLUICE_LUA_MAX_COLLECTIONS` at most.
static void *sluice_lua_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    sluice_lua_meter *m = (sluice_lua_meter *)ud;
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        free(ptr);
        m->used -= old;
        return NULL;
    }
    int retry = m->refused && ptr == m->refused_ptr && osize == m->refused_osize && nsize == m->refused_nsize;
    if (m->refused && !retry) sluice_lua_refusal_stands(m);
    // A stopped call may still make its error messages as it unwinds: 64 KiB past the cap, so
    // that each does not bring a collection (Lua's, uncounted) at the cap.
    size_t limit = m->stopped == SLUICE_LUA_RUNNING ? m->limit : m->limit + 65536;
    if (nsize > old && m->grace == 0 && m->used - old + nsize > limit) {
        if (m->refused || m->stopped != SLUICE_LUA_RUNNING || m->collections >= SLUICE_LUA_MAX_COLLECTIONS) {
            sluice_lua_refusal_stands(m);
        } else {
            m->collections += 1;
            m->refused = 1;
            m->refused_ptr = ptr;
            m->refused_osize = osize;
            m->refused_nsize = nsize;
            if (!sluice_lua_tick(m, 1)) sluice_lua_stop_soon(m);
        }
        return NULL;
    }
    void *p = realloc(ptr, nsize);
    if (p == NULL) return NULL;
    m->refused = 0;
    m->used = m->used - old + nsize;
    if (m->used > m->peak) m->peak = m->used;
    return p;
}

/// Raises the stop of the call running `ar`'s function. From then on every hook raises again
/// at once (the period drops to 1), so a script's `pcall` cannot swallow the stop.
static void sluice_lua_raise_stop(lua_State *L, lua_Debug *ar) {
    sluice_lua_meter *m = sluice_lua_meter_of(L);
    lua_sethook(L, sluice_lua_hook, LUA_MASKCOUNT, 1);
    switch (m->stopped) {
    case SLUICE_LUA_STOPPED_INSTRUCTIONS: sluice_lua_hook_raise(L, ar, "instruction limit reached"); break;
    case SLUICE_LUA_STOPPED_WALL: sluice_lua_hook_raise(L, ar, "wall-clock limit reached"); break;
    default: sluice_lua_hook_raise(L, ar, "memory limit reached"); break;
    }
}

/// The count hook.
static void sluice_lua_hook(lua_State *L, lua_Debug *ar) {
    sluice_lua_meter *m = sluice_lua_meter_of(L);
    // A refusal still pending when Lua code runs again was not retried: it stands.
    if (m->refused) sluice_lua_refusal_stands(m);
    if (!sluice_lua_tick(m, 1)) sluice_lua_raise_stop(L, ar);
}

/// Charges `periods` to the call from a C function the script called (the pattern matcher of
/// match.h), where the count hook cannot fire; raises, located at the script's calling line,
/// when a limit stops the call.
static void sluice_lua_charge(lua_State *L, long long periods) {
    if (sluice_lua_tick(sluice_lua_meter_of(L), periods)) return;
    lua_Debug ar;
    if (lua_getstack(L, 1, &ar)) sluice_lua_raise_stop(L, &ar);
    lua_pushliteral(L, "limit reached");
    lua_error(L);
}

/// A full collection, charged a period and followed by a read of the clock (its work grows
/// with the heap, unseen by the count hook); raises, as `sluice_lua_charge` does, when that
/// ends the call's budget.
static inline void sluice_lua_collect(lua_State *L) {
    sluice_lua_meter *m = sluice_lua_meter_of(L);
    if (m->collections >= SLUICE_LUA_MAX_COLLECTIONS) return;
    m->collections += 1;
    lua_gc(L, LUA_GCCOLLECT);
    sluice_lua_charge(L, 1);
}

/// A full collection between calls (no coroutine of the state running): what slots retired
/// after a burst of waiting calls left (`LuaState.releaseSlot`). Scripts cannot set `__gc`
/// (LuaSandbox), so no Lua code runs.
static inline void sluice_lua_collect_between_calls(lua_State *L) {
    lua_gc(L, LUA_GCCOLLECT);
}

/// Collects first when `bytes` more would pass the cap: for a C function about to fill a
/// lauxlib buffer, whose allocations get no collection and retry (`sluice_lua_alloc`).
static inline void sluice_lua_make_room(lua_State *L, size_t bytes) {
    sluice_lua_meter *m = sluice_lua_meter_of(L);
    if (m->used + m->external + bytes > m->limit) sluice_lua_collect(L);
}

/// Arms `co` for one call: the count hook at its period (which also resets its counter).
static inline void sluice_lua_arm(lua_State *co) {
    lua_sethook(co, sluice_lua_hook, LUA_MASKCOUNT, SLUICE_LUA_HOOK_PERIOD);
}

/// A Swift function Lua may call: returns its number of results, or -1 with an error message
/// on top of the stack (the trampoline prefixes the caller's "chunk:line:" and raises it), or
/// SLUICE_LUA_YIELD to suspend the calling coroutine (the trampoline yields it: a yield is a
/// longjmp too). The function checks `lua_isyieldable` first; the values `lua_resume` is
/// later given are the call's results (Sources/SluiceCore/Lua/LuaWait.swift).
typedef int (*sluice_lua_swift_function)(lua_State *L);

#define SLUICE_LUA_YIELD (-2)

static int sluice_lua_trampoline(lua_State *L) {
    sluice_lua_swift_function f = (sluice_lua_swift_function)lua_touserdata(L, lua_upvalueindex(1));
    sluice_lua_meter *m = sluice_lua_meter_of(L);
    if (m->refused) sluice_lua_refusal_stands(m);  // not retried
    if (m->stopped != SLUICE_LUA_RUNNING) {
        // A stop the script caught with `pcall` (the allocator's refusal, which the count
        // hook raises only at its next period): no Swift function runs after it.
        lua_Debug ar;
        if (lua_getstack(L, 1, &ar)) sluice_lua_raise_stop(L, &ar);
        lua_pushliteral(L, "limit reached");
        return lua_error(L);
    }
    m->grace += 1;
    int n = f(L);
    m->grace -= 1;
    if (n == SLUICE_LUA_YIELD) return lua_yield(L, 0);
    if (n >= 0 && m->grace == 0 && m->used + m->external > m->limit)
        // Over the cap after a Swift function: collected first, as the allocator's refusal is
        // (the function's results are on the stack, so they survive it).
        sluice_lua_collect(L);
    if (n >= 0 && m->grace == 0 && m->used + m->external > m->limit) {
        m->stopped = SLUICE_LUA_STOPPED_MEMORY;
        lua_pushliteral(L, "memory limit reached");
        n = -1;
    }
    if (n < 0) {
        luaL_where(L, 1);
        lua_rotate(L, -2, 1);
        lua_concat(L, 2);
        return lua_error(L);
    }
    return n;
}

/// Pushes Swift function `f` as a Lua function with `extra` upvalues (taken from the stack;
/// the function reads them at `lua_upvalueindex(2)` on).
static inline void sluice_lua_push_swift(lua_State *L, sluice_lua_swift_function f, int extra) {
    lua_pushlightuserdata(L, (void *)f);
    if (extra > 0) lua_rotate(L, -(extra + 1), 1);
    lua_pushcclosure(L, sluice_lua_trampoline, extra + 1);
}

static inline lua_State *sluice_lua_newstate(sluice_lua_meter *m) {
    lua_State *L = lua_newstate(sluice_lua_alloc, m);
    if (L) *(sluice_lua_meter **)lua_getextraspace(L) = m;
    return L;
}

// Macros as functions.
static inline int sluice_lua_registryindex(void) { return LUA_REGISTRYINDEX; }
static inline int sluice_lua_upvalueindex(int i) { return lua_upvalueindex(i); }
static inline int sluice_lua_ridx_globals(void) { return LUA_RIDX_GLOBALS; }
static inline void sluice_lua_pop(lua_State *L, int n) { lua_pop(L, n); }
static inline void sluice_lua_newtable(lua_State *L) { lua_newtable(L); }
static inline const char *sluice_lua_tolstring(lua_State *L, int i, size_t *len) { return lua_tolstring(L, i, len); }
static inline int sluice_lua_isinteger(lua_State *L, int i) { return lua_isinteger(L, i); }
static inline lua_Integer sluice_lua_tointeger(lua_State *L, int i, int *isnum) { return lua_tointegerx(L, i, isnum); }
static inline lua_Number sluice_lua_tonumber(lua_State *L, int i, int *isnum) { return lua_tonumberx(L, i, isnum); }
static inline void sluice_lua_insert(lua_State *L, int i) { lua_insert(L, i); }
static inline void sluice_lua_remove(lua_State *L, int i) { lua_remove(L, i); }
static inline void sluice_lua_replace(lua_State *L, int i) { lua_replace(L, i); }
static inline void *sluice_lua_newuserdata(lua_State *L, size_t size, int uservalues) { return lua_newuserdatauv(L, size, uservalues); }
static inline int sluice_lua_pcall(lua_State *L, int nargs, int nresults) { return lua_pcall(L, nargs, nresults, 0); }
static inline int sluice_lua_load(lua_State *L, const char *text, size_t len, const char *chunkname) {
    return luaL_loadbufferx(L, text, len, chunkname, "t");
}
static inline void sluice_lua_pushcfunction(lua_State *L, lua_CFunction f) { lua_pushcfunction(L, f); }

#include "match.h"
#include "loops.h"

/// Puts the metered pattern functions (match.h) in the `string` table on top of `L`.
static inline void sluice_lua_meter_patterns(lua_State *L) {
    lua_pushcfunction(L, sluice_lua_str_find);
    lua_setfield(L, -2, "find");
    lua_pushcfunction(L, sluice_lua_str_match);
    lua_setfield(L, -2, "match");
    lua_pushcfunction(L, sluice_lua_gmatch);
    lua_setfield(L, -2, "gmatch");
    lua_pushcfunction(L, sluice_lua_str_gsub);
    lua_setfield(L, -2, "gsub");
}

#endif

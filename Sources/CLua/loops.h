#ifndef SLUICE_CLUA_LOOPS_H
#define SLUICE_CLUA_LOOPS_H

#include <limits.h>
// The library functions whose work runs inside one C call, where the count hook never fires,
// made to answer to a call's limits as the pattern functions of match.h do:
//
// - `table.insert`, `table.remove` and `table.move` loop over a range a script chooses (a
//   length from `__len`, an end index) and need no memory to do it: written here from the Lua
//   5.4 reference manual (§6.6), with its semantics and messages for tables, they charge one
//   instruction per element moved (`sluice_lua_charge`, one period per 1,024).
// - `string.rep` of an empty string with an empty separator loops `n` times making nothing:
//   it is answered at once (the result is empty); otherwise its output is bounded by the
//   memory cap, and it is charged by the bytes it makes when they fit under the cap.
// - `table.sort` runs liblua's own sort on a table without a metatable (its size is bounded
//   by the memory cap, an order function is Lua and counted, the default order charged by the
//   strings it compares); a table with a metatable is refused, since C functions as
//   `__index`/`__newindex`/`__len` would make its loops free.
// - `table.concat` and `table.unpack` are written here too: each element they read may go
//   through a chain of `__index` tables, so each is a step, as a moved element is.
// - Functions that work through their string arguments or build long strings in C (`upper`,
//   `reverse`, `format`, `table.concat`, `load`, `utf8.len`, ...) read the wall clock before
//   they run and charge one period per 16 KiB of string arguments: a loop of calls on a large
//   string, a few VM instructions each, can no longer run past the wall-clock budget for up to
//   a period's worth of calls.
//
// Included by shim.h only; everything runs on the thread of the calling state.

/// Charges one period per 1,024 elements: `i` counts the elements done so far.
static inline void sluice_lua_step(lua_State *L, lua_Integer i) {
    if ((i & 1023) == 1023) sluice_lua_charge(L, 1);
}

/// `table.insert(t, [pos,] value)`.
static int sluice_lua_tinsert(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    // The first free position: one past the length (which `__len` may give).
    lua_Integer first_free = (lua_Integer)((lua_Unsigned)luaL_len(L, 1) + 1u);
    lua_Integer pos = first_free;
    switch (lua_gettop(L)) {
    case 2:
        break;
    case 3: {
        pos = luaL_checkinteger(L, 2);
        luaL_argcheck(L, (lua_Unsigned)pos - 1u < (lua_Unsigned)first_free, 2, "position out of bounds");
        lua_Integer done = 0;
        for (lua_Integer i = first_free; i > pos; i--, done++) {
            sluice_lua_step(L, done);
            lua_geti(L, 1, i - 1);
            lua_seti(L, 1, i);
        }
        break;
    }
    default:
        return luaL_error(L, "wrong number of arguments to 'insert'");
    }
    lua_seti(L, 1, pos);
    return 0;
}

/// `table.remove(t [, pos])`: returns the element removed.
static int sluice_lua_tremove(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_Integer size = luaL_len(L, 1);
    lua_Integer pos = luaL_optinteger(L, 2, size);
    if (pos != size)
        luaL_argcheck(L, (lua_Unsigned)pos - 1u <= (lua_Unsigned)size, 2, "position out of bounds");
    lua_geti(L, 1, pos);
    lua_Integer done = 0;
    for (; pos < size; pos++, done++) {
        sluice_lua_step(L, done);
        lua_geti(L, 1, pos + 1);
        lua_seti(L, 1, pos);
    }
    lua_pushnil(L);
    lua_seti(L, 1, pos);
    return 1;
}

/// `table.move(a1, f, e, t [, a2])`: returns the destination.
static int sluice_lua_tmove(lua_State *L) {
    lua_Integer f = luaL_checkinteger(L, 2);
    lua_Integer e = luaL_checkinteger(L, 3);
    lua_Integer t = luaL_checkinteger(L, 4);
    int dest = lua_isnoneornil(L, 5) ? 1 : 5;
    luaL_checktype(L, 1, LUA_TTABLE);
    luaL_checktype(L, dest, LUA_TTABLE);
    if (e >= f) {
        luaL_argcheck(L, f > 0 || e < LUA_MAXINTEGER + f, 3, "too many elements to move");
        lua_Integer n = e - f + 1;
        luaL_argcheck(L, t <= LUA_MAXINTEGER - n + 1, 4, "destination wrap around");
        // Overlapping forward moves go from the end, so no element is overwritten first.
        int backwards = t > f && t <= e && (dest == 1 || lua_compare(L, 1, dest, LUA_OPEQ));
        for (lua_Integer done = 0; done < n; done++) {
            sluice_lua_step(L, done);
            lua_Integer i = backwards ? n - 1 - done : done;
            lua_geti(L, 1, f + i);
            lua_seti(L, dest, t + i);
        }
    }
    lua_pushvalue(L, dest);
    return 1;
}

/// `table.concat(list [, sep [, i [, j]]])`: each element read (through `__index`, which may
/// be a chain of tables) is a step, so a long range is charged and the wall clock read.
static int sluice_lua_tconcat(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    size_t lsep;
    const char *sep = luaL_optlstring(L, 2, "", &lsep);
    lua_Integer i = luaL_optinteger(L, 3, 1);
    lua_Integer last = lua_isnoneornil(L, 4) ? luaL_len(L, 1) : luaL_checkinteger(L, 4);
    sluice_lua_charge(L, (long long)(lsep >> 14));
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    lua_Integer done = 0;
    for (; i <= last; i++, done++) {
        sluice_lua_step(L, done);
        lua_geti(L, 1, i);
        if (!lua_isstring(L, -1))
            return luaL_error(L, "invalid value (at index %I) in table for 'concat'", (LUAI_UACINT)i);
        luaL_addvalue(&b);
        if (i == last) break;  // `last` may be LUA_MAXINTEGER
        luaL_addlstring(&b, sep, lsep);
    }
    luaL_pushresult(&b);
    return 1;
}

/// `table.unpack(list [, i [, j]])`: as `concat`, a step per element read.
static int sluice_lua_tunpack(lua_State *L) {
    lua_Integer i = luaL_optinteger(L, 2, 1);
    lua_Integer e = lua_isnoneornil(L, 3) ? luaL_len(L, 1) : luaL_checkinteger(L, 3);
    if (i > e) return 0;
    lua_Unsigned n = (lua_Unsigned)e - (lua_Unsigned)i;
    if (n >= (unsigned int)INT_MAX || !lua_checkstack(L, (int)(++n)))
        return luaL_error(L, "too many results to unpack");
    for (lua_Integer done = 0; i < e; i++, done++) {
        sluice_lua_step(L, done);
        lua_geti(L, 1, i);
    }
    lua_geti(L, 1, e);
    return (int)n;
}

/// The text `load` compiles, handed to the parser 1 KiB at a time.
typedef struct {
    lua_State *L;
    const char *text;
    size_t left;
} sluice_lua_load_text;

/// `lua_load`'s reader: the next piece of the text, after a read of the wall clock. The
/// parser's work is not linear in the text (a name is looked up among every local of every
/// enclosing function), so a large chunk made to be slow to compile is stopped between
/// pieces: on a stop the text ends early (a syntax error for `load`), and the stop is raised at
/// the script's next instruction.
static const char *sluice_lua_load_piece(lua_State *L, void *ud, size_t *size) {
    (void)L;
    sluice_lua_load_text *t = (sluice_lua_load_text *)ud;
    sluice_lua_meter *m = sluice_lua_meter_of(t->L);
    if (t->left == 0 || !sluice_lua_tick(m, 0)) {
        if (m->stopped != SLUICE_LUA_RUNNING) sluice_lua_stop_soon(m);
        *size = 0;
        return NULL;
    }
    size_t n = t->left < 1024 ? t->left : 1024;
    const char *piece = t->text;
    t->text += n;
    t->left -= n;
    *size = n;
    return piece;
}

/// `load(chunk [, chunkname [, mode [, env]]])` of a text chunk, as liblua's, charged by its
/// length and compiled in pieces (`sluice_lua_load_piece`). A function as the chunk (a reader)
/// is refused: each piece it returns would be compiled unseen.
static int sluice_lua_load_chunk(lua_State *L) {
    if (lua_type(L, 1) != LUA_TSTRING)
        return luaL_error(L, "load: the chunk must be a string (a reader function is not run in a script)");
    size_t length;
    const char *text = lua_tolstring(L, 1, &length);
    const char *name = luaL_optstring(L, 2, text);
    const char *mode = luaL_optstring(L, 3, "bt");
    int env = !lua_isnone(L, 4) ? 4 : 0;
    sluice_lua_charge(L, (long long)(length >> 14));
    sluice_lua_load_text t = {L, text, length};
    int status = lua_load(L, sluice_lua_load_piece, &t, name, mode);
    if (status == LUA_OK) {
        if (env != 0) {
            lua_pushvalue(L, env);
            if (!lua_setupvalue(L, -2, 1)) lua_pop(L, 1);
        }
        return 1;
    }
    luaL_pushfail(L);
    lua_insert(L, -2);
    return 2;
}

/// Runs, in this call's frame, the liblua function a wrapper made by `sluice_lua_wrap` holds
/// (upvalue 1): its argument errors name it as the script called it.
static inline int sluice_lua_run_wrapped(lua_State *L) {
    lua_CFunction f = (lua_CFunction)lua_touserdata(L, lua_upvalueindex(1));
    return f(L);
}

/// The wall clock, and one period per 16 KiB of the call's string arguments; returns their
/// bytes.
static inline size_t sluice_lua_charge_strings(lua_State *L) {
    size_t bytes = 0;
    int n = lua_gettop(L);
    for (int i = 1; i <= n; i++)
        if (lua_type(L, i) == LUA_TSTRING) bytes += lua_rawlen(L, i);
    sluice_lua_charge(L, (long long)(bytes >> 14));
    return bytes;
}

/// Runs the wrapped library function (upvalue 1), which builds its result of about `bytes`
/// in a lauxlib buffer: such a buffer asks the allocator itself and raises at its first
/// refusal, without the collection Lua runs before refusing its own allocations, so the
/// garbage is collected first when the call's peak — the buffer and the string copied from
/// it, twice `bytes` — would pass the cap (`sluice_lua_make_room`).
static inline int sluice_lua_run_buffered(lua_State *L, size_t bytes) {
    sluice_lua_make_room(L, 2 * bytes);
    return sluice_lua_run_wrapped(L);
}

/// A library function (upvalue 1, a light C function pointer) charged by its string arguments,
/// then run in this call's frame: its argument errors name it as the script called it.
static int sluice_lua_bulk(lua_State *L) {
    sluice_lua_charge_strings(L);
    return sluice_lua_run_wrapped(L);
}

/// `sluice_lua_bulk` for a function that builds its result in a lauxlib buffer about as long as
/// its string arguments (`upper`, `format`, `table.concat`…): run by `sluice_lua_run_buffered`.
static int sluice_lua_bulk_buffered(lua_State *L) {
    return sluice_lua_run_buffered(L, sluice_lua_charge_strings(L));
}

/// The trampoline of a `sluice` function that works through its string arguments (a hash, an
/// encoding, `json`): charged as `sluice_lua_bulk` is, then run as any Swift function.
static int sluice_lua_trampoline_bulk(lua_State *L) {
    sluice_lua_charge_strings(L);
    return sluice_lua_trampoline(L);
}

/// `sluice_lua_push_swift` (no extra upvalues) through `sluice_lua_trampoline_bulk`.
static inline void sluice_lua_push_swift_bulk(lua_State *L, sluice_lua_swift_function f) {
    lua_pushlightuserdata(L, (void *)f);
    lua_pushcclosure(L, sluice_lua_trampoline_bulk, 1);
}

/// `string.rep(s, n [, sep])`: nothing to repeat is answered at once; otherwise liblua's
/// (upvalue 1), charged by the bytes it will make.
static int sluice_lua_str_rep(lua_State *L) {
    size_t length, separator;
    luaL_checklstring(L, 1, &length);
    lua_Integer n = luaL_checkinteger(L, 2);
    luaL_optlstring(L, 3, "", &separator);
    if (n <= 0 || length + separator == 0) {
        lua_pushliteral(L, "");
        return 1;
    }
    // Charged by what it makes when that fits the memory cap; a larger result is refused by
    // the allocator (or by liblua, past what a string can hold), with the cap's message.
    sluice_lua_meter *m = sluice_lua_meter_of(L);
    if (length + separator > m->limit / (size_t)n) return sluice_lua_run_buffered(L, 0);  // never fits
    size_t bytes = (size_t)n * (length + separator);
    sluice_lua_charge(L, (long long)(bytes >> 14));
    return sluice_lua_run_buffered(L, bytes);
}

/// The message handler a script gave `xpcall` (upvalue 1), run only while the call is not
/// stopped. Lua runs a message handler where the error is raised, and a stop is raised inside
/// the count hook, where hooks are off: the script's handler, run then, would run unmetered
/// (a `while true do end` handler held the worker for good). A stop passes through as it is.
static int sluice_lua_xpcall_handler(lua_State *L) {
    sluice_lua_meter *m = sluice_lua_meter_of(L);
    if (m->stopped != SLUICE_LUA_RUNNING || m->refused) return 1;
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

/// `xpcall(f, msgh, ...)`: liblua's (upvalue 1) with `msgh` run by `sluice_lua_xpcall_handler`.
/// liblua's continuation (a yield inside `f`) finds the stack as it would have.
static int sluice_lua_xpcall(lua_State *L) {
    luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_pushvalue(L, 2);
    lua_pushcclosure(L, sluice_lua_xpcall_handler, 1);
    lua_replace(L, 2);
    return sluice_lua_run_wrapped(L);
}

/// The order of a `table.sort` without an order function: Lua's `<`, read the wall clock
/// before and charged one period per 16 KiB for a pair of long strings. Lua compares strings
/// piece by piece between their NUL bytes (a `strcoll` each): a sort of long strings of NULs
/// did seconds of work in one call for the sort's charge of its length.
static int sluice_lua_sort_less(lua_State *L) {
    size_t a = lua_type(L, 1) == LUA_TSTRING ? lua_rawlen(L, 1) : 0;
    size_t b = lua_type(L, 2) == LUA_TSTRING ? lua_rawlen(L, 2) : 0;
    if (a + b >= 1024) sluice_lua_charge(L, (long long)((a + b) >> 14));
    lua_pushboolean(L, lua_compare(L, 1, 2, LUA_OPLT));
    return 1;
}

/// `table.sort(t [, comp])`: liblua's (upvalue 1) on a table without a metatable, in the
/// order `sluice_lua_sort_less` gives when the script gives none.
static int sluice_lua_tsort(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    if (!lua_isnoneornil(L, 2)) {
        luaL_checktype(L, 2, LUA_TFUNCTION);
    } else {
        lua_settop(L, 1);
        lua_pushcfunction(L, sluice_lua_sort_less);
    }
    if (lua_getmetatable(L, 1)) return luaL_error(L, "table.sort: a table with a metatable is not sorted in a script");
    // n log n comparisons at most, n bounded by the memory cap: one period per 1,024 elements
    // up front, and the wall clock read.
    sluice_lua_charge(L, (long long)(lua_rawlen(L, 1) >> 10));
    return sluice_lua_run_wrapped(L);
}

/// Replaces field `name` of the table on top of `L` with `wrapper`, which finds the field's
/// liblua function as a light userdata in upvalue 1.
static inline void sluice_lua_wrap(lua_State *L, const char *name, lua_CFunction wrapper) {
    lua_getfield(L, -1, name);
    lua_CFunction original = lua_tocfunction(L, -1);
    lua_pop(L, 1);
    lua_pushlightuserdata(L, (void *)original);
    lua_pushcclosure(L, wrapper, 1);
    lua_setfield(L, -2, name);
}

/// Puts the metered functions above in place of liblua's: in the library table on top of `L`
/// (`string`, `table`, `utf8`, or the globals for `load`), by the library's name.
static inline void sluice_lua_meter_loops(lua_State *L, const char *library) {
    if (strcmp(library, "table") == 0) {
        lua_pushcfunction(L, sluice_lua_tinsert);
        lua_setfield(L, -2, "insert");
        lua_pushcfunction(L, sluice_lua_tremove);
        lua_setfield(L, -2, "remove");
        lua_pushcfunction(L, sluice_lua_tmove);
        lua_setfield(L, -2, "move");
        sluice_lua_wrap(L, "sort", sluice_lua_tsort);
        lua_pushcfunction(L, sluice_lua_tconcat);
        lua_setfield(L, -2, "concat");
        lua_pushcfunction(L, sluice_lua_tunpack);
        lua_setfield(L, -2, "unpack");
    } else if (strcmp(library, "string") == 0) {
        sluice_lua_wrap(L, "rep", sluice_lua_str_rep);
        static const char *const bulk[] = {"byte", "sub", "unpack", "packsize", NULL};
        for (int i = 0; bulk[i]; i++) sluice_lua_wrap(L, bulk[i], sluice_lua_bulk);
        static const char *const buffered[] = {"char", "format", "lower", "pack", "reverse", "upper", NULL};
        for (int i = 0; buffered[i]; i++) sluice_lua_wrap(L, buffered[i], sluice_lua_bulk_buffered);
    } else if (strcmp(library, "utf8") == 0) {
        static const char *const bulk[] = {"codepoint", "len", "offset", NULL};
        for (int i = 0; bulk[i]; i++) sluice_lua_wrap(L, bulk[i], sluice_lua_bulk);
        sluice_lua_wrap(L, "char", sluice_lua_bulk_buffered);
    } else if (strcmp(library, "_G") == 0) {
        static const char *const bulk[] = {"tonumber", "tostring", NULL};
        for (int i = 0; bulk[i]; i++) sluice_lua_wrap(L, bulk[i], sluice_lua_bulk);
        sluice_lua_wrap(L, "xpcall", sluice_lua_xpcall);
        lua_pushcfunction(L, sluice_lua_load_chunk);
        lua_setfield(L, -2, "load");
    }
}

#endif

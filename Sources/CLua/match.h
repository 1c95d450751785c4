#ifndef SLUICE_CLUA_MATCH_H
#define SLUICE_CLUA_MATCH_H
// Sluice's own Lua pattern matcher, written here from the Lua 5.4 reference manual (§6.4 and
// §6.4.1): `string.find`, `string.match`, `string.gmatch` and `string.gsub`, with Lua 5.4's
// semantics and error messages, metered. Pattern matching runs inside one C call, where the
// count hook never fires, so the matcher counts its steps (a match call, a byte an expansion, a
// `%b` or a back-reference passes, a byte a plain find compares) and charges them to the
// call's instruction budget, one instruction per step (`sluice_lua_charge` in shim.h, which
// may raise). Nothing here holds memory of its own across a charge: results are built in Lua
// buffers on the Lua stack. LuaPatternTests compares these functions with liblua's own.
//
// Included by shim.h only; everything runs on the thread of the calling state.
#include <ctype.h>
#include <string.h>

/// Captures a pattern may open (Lua's limit).
#define SLUICE_MATCH_MAXCAPTURES 32
/// Nested match calls before "pattern too complex": bounds the C stack.
#define SLUICE_MATCH_MAXDEPTH 200
/// A capture's length while it is still open, and the length of a position capture `()`.
#define SLUICE_MATCH_OPEN (-1)
#define SLUICE_MATCH_POSITION (-2)

/// One match in progress: the subject, the pattern's end, the captures so far and the steps
/// not yet charged.
typedef struct sluice_match {
    lua_State *L;
    const char *subject;
    const char *subject_end;
    const char *pattern_end;
    int depth;
    int captures;
    long long steps;
    struct {
        const char *start;
        ptrdiff_t length;
    } capture[SLUICE_MATCH_MAXCAPTURES];
} sluice_match;

/// Counts `n` steps; charges whole periods to the budget (which may raise).
static void sluice_match_step(sluice_match *m, long long n) {
    m->steps += n;
    if (m->steps >= SLUICE_LUA_HOOK_PERIOD) {
        long long periods = m->steps / SLUICE_LUA_HOOK_PERIOD;
        m->steps -= periods * SLUICE_LUA_HOOK_PERIOD;
        sluice_lua_charge(m->L, periods);
    }
}

/// Whether byte `c` is in class letter `letter` (`%a`, `%D`, …); any other letter stands for
/// itself (`%.`, `%%`).
static int sluice_match_class(int c, int letter) {
    int in;
    switch (tolower(letter)) {
    case 'a': in = isalpha(c); break;
    case 'c': in = iscntrl(c); break;
    case 'd': in = isdigit(c); break;
    case 'g': in = isgraph(c); break;
    case 'l': in = islower(c); break;
    case 'p': in = ispunct(c); break;
    case 's': in = isspace(c); break;
    case 'u': in = isupper(c); break;
    case 'w': in = isalnum(c); break;
    case 'x': in = isxdigit(c); break;
    case 'z': in = c == 0; break; // not in 5.4's manual, but liblua 5.4 still has it
    default: return letter == c;
    }
    in = in != 0;
    return isupper(letter) ? !in : in;
}

/// The end of the single-character class starting at `p` (a byte, `.`, `%x` or a set).
static const char *sluice_match_item_end(sluice_match *m, const char *p) {
    if (*p == '%') {
        if (p + 1 >= m->pattern_end) luaL_error(m->L, "malformed pattern (ends with '%%')");
        return p + 2;
    }
    if (*p != '[') return p + 1;
    const char *q = p + 1;
    if (q < m->pattern_end && *q == '^') q++;
    // The set's first member is taken as is, even `]`.
    do {
        if (q >= m->pattern_end) luaL_error(m->L, "malformed pattern (missing ']')");
        char c = *q++;
        if (c == '%' && q < m->pattern_end) q++;
    } while (q >= m->pattern_end || *q != ']');
    return q + 1;
}

/// Whether byte `c` is in the set `[` at `p` … `]` at `close`.
static int sluice_match_set(int c, const char *p, const char *close) {
    int negated = 0;
    p++;
    if (*p == '^') {
        negated = 1;
        p++;
    }
    while (p < close) {
        if (*p == '%' && p + 1 < close) {
            if (sluice_match_class(c, (unsigned char)p[1])) return !negated;
            p += 2;
        } else if (p + 2 < close && p[1] == '-') {
            if ((unsigned char)p[0] <= c && c <= (unsigned char)p[2]) return !negated;
            p += 3;
        } else {
            if ((unsigned char)*p == c) return !negated;
            p++;
        }
    }
    return negated;
}

/// Whether the subject byte at `s` matches the single-character class `p`…`end`. A `[...]`
/// set is charged a step per 16 of its bytes: it is read whole at each byte, and a long one
/// in a loop is work the match calls alone would not count (a short one costs nothing more).
static int sluice_match_one(sluice_match *m, const char *s, const char *p, const char *end) {
    if (*p == '[') sluice_match_step(m, (end - p) >> 4);
    if (s >= m->subject_end) return 0;
    int c = (unsigned char)*s;
    switch (*p) {
    case '.': return 1;
    case '%': return sluice_match_class(c, (unsigned char)p[1]);
    case '[': return sluice_match_set(c, p, end - 1);
    default: return (unsigned char)*p == c;
    }
}

static const char *sluice_match_at(sluice_match *m, const char *s, const char *p);

/// The longest run of `p`…`end` from `s`, then shorter ones, each followed by the rest.
static const char *sluice_match_greedy(sluice_match *m, const char *s, const char *p, const char *end) {
    ptrdiff_t n = 0;
    while (sluice_match_one(m, s + n, p, end)) {
        n++;
        sluice_match_step(m, 1);
    }
    for (; n >= 0; n--) {
        const char *r = sluice_match_at(m, s + n, end + 1);
        if (r) return r;
    }
    return NULL;
}

/// The shortest run of `p`…`end` from `s` the rest matches after.
static const char *sluice_match_lazy(sluice_match *m, const char *s, const char *p, const char *end) {
    for (;;) {
        const char *r = sluice_match_at(m, s, end + 1);
        if (r) return r;
        if (!sluice_match_one(m, s, p, end)) return NULL;
        s++;
    }
}

/// `%bxy` at `s` (`p` points at x): the end of the balanced run, or NULL.
static const char *sluice_match_balanced(sluice_match *m, const char *s, const char *p) {
    if (p + 1 >= m->pattern_end) luaL_error(m->L, "malformed pattern (missing arguments to '%%b')");
    if (s >= m->subject_end || *s != p[0]) return NULL;
    int depth = 1;
    for (s++; s < m->subject_end; s++) {
        sluice_match_step(m, 1);
        if (*s == p[1]) {
            if (--depth == 0) return s + 1;
        } else if (*s == p[0]) {
            depth++;
        }
    }
    return NULL;
}

/// The capture a back-reference `%digit` names; raises when it is not a closed capture.
static int sluice_match_reference(sluice_match *m, int digit) {
    int index = digit - '1';
    if (index < 0 || index >= m->captures || m->capture[index].length == SLUICE_MATCH_OPEN)
        return luaL_error(m->L, "invalid capture index %%%d", index + 1);
    return index;
}

/// A back-reference at `s`: the end of the repeated text, or NULL.
static const char *sluice_match_repeat(sluice_match *m, const char *s, int digit) {
    int index = sluice_match_reference(m, digit);
    ptrdiff_t length = m->capture[index].length;
    if (length < 0 || m->subject_end - s < length) return NULL;
    sluice_match_step(m, length);
    return memcmp(m->capture[index].start, s, (size_t)length) == 0 ? s + length : NULL;
}

static const char *sluice_match_open(sluice_match *m, const char *s, const char *p, ptrdiff_t kind) {
    if (m->captures >= SLUICE_MATCH_MAXCAPTURES) luaL_error(m->L, "too many captures");
    int index = m->captures++;
    m->capture[index].start = s;
    m->capture[index].length = kind;
    const char *r = sluice_match_at(m, s, p);
    if (!r) m->captures--;
    return r;
}

static const char *sluice_match_close(sluice_match *m, const char *s, const char *p) {
    int index = m->captures - 1;
    while (index >= 0 && m->capture[index].length != SLUICE_MATCH_OPEN) index--;
    if (index < 0) luaL_error(m->L, "invalid pattern capture");
    m->capture[index].length = s - m->capture[index].start;
    const char *r = sluice_match_at(m, s, p);
    if (!r) m->capture[index].length = SLUICE_MATCH_OPEN;
    return r;
}

/// Matches pattern `p`… at subject position `s`: the end of the match, or NULL.
static const char *sluice_match_body(sluice_match *m, const char *s, const char *p) {
    for (;;) {
        if (p >= m->pattern_end) return s;
        switch (*p) {
        case '(':
            if (p + 1 < m->pattern_end && p[1] == ')') return sluice_match_open(m, s, p + 2, SLUICE_MATCH_POSITION);
            return sluice_match_open(m, s, p + 1, SLUICE_MATCH_OPEN);
        case ')': return sluice_match_close(m, s, p + 1);
        case '$':
            if (p + 1 == m->pattern_end) return s == m->subject_end ? s : NULL;
            break;
        case '%':
            if (p + 1 >= m->pattern_end) break;
            if (p[1] == 'b') {
                s = sluice_match_balanced(m, s, p + 2);
                if (!s) return NULL;
                p += 4;
                continue;
            }
            if (p[1] == 'f') {
                p += 2;
                if (p >= m->pattern_end || *p != '[') luaL_error(m->L, "missing '[' after '%%f' in pattern");
                const char *end = sluice_match_item_end(m, p);
                int before = s == m->subject ? 0 : (unsigned char)s[-1];
                int after = s < m->subject_end ? (unsigned char)*s : 0;
                sluice_match_step(m, (end - p) >> 3);
                if (sluice_match_set(before, p, end - 1) || !sluice_match_set(after, p, end - 1)) return NULL;
                p = end;
                continue;
            }
            if (isdigit((unsigned char)p[1])) {
                s = sluice_match_repeat(m, s, (unsigned char)p[1]);
                if (!s) return NULL;
                p += 2;
                continue;
            }
            break;
        default: break;
        }
        const char *end = sluice_match_item_end(m, p);
        int here = sluice_match_one(m, s, p, end);
        if (end < m->pattern_end) {
            switch (*end) {
            case '?':
                if (here) {
                    const char *r = sluice_match_at(m, s + 1, end + 1);
                    if (r) return r;
                }
                p = end + 1;
                continue;
            case '+': return here ? sluice_match_greedy(m, s + 1, p, end) : NULL;
            case '*': return sluice_match_greedy(m, s, p, end);
            case '-': return sluice_match_lazy(m, s, p, end);
            default: break;
            }
        }
        if (!here) return NULL;
        // A step per item matched one after another (`....` over a long subject).
        sluice_match_step(m, 1);
        s++;
        p = end;
    }
}

/// One counted, depth-bounded match call.
static const char *sluice_match_at(sluice_match *m, const char *s, const char *p) {
    sluice_match_step(m, 1);
    if (m->depth >= SLUICE_MATCH_MAXDEPTH) luaL_error(m->L, "pattern too complex");
    m->depth++;
    const char *r = sluice_match_body(m, s, p);
    m->depth--;
    return r;
}

static void sluice_match_init(sluice_match *m, lua_State *L, const char *s, size_t ls, const char *p, size_t lp) {
    m->L = L;
    m->subject = s;
    m->subject_end = s + ls;
    m->pattern_end = p + lp;
    m->depth = 0;
    m->captures = 0;
    m->steps = 0;
}

/// Pushes capture `i` of the match `s`…`e` (the whole match when the pattern has none).
static void sluice_match_push_capture(sluice_match *m, int i, const char *s, const char *e) {
    if (i >= m->captures) {
        if (i != 0) luaL_error(m->L, "invalid capture index %%%d", i + 1);
        lua_pushlstring(m->L, s, (size_t)(e - s));
        return;
    }
    ptrdiff_t length = m->capture[i].length;
    if (length == SLUICE_MATCH_OPEN) luaL_error(m->L, "unfinished capture");
    if (length == SLUICE_MATCH_POSITION)
        lua_pushinteger(m->L, (lua_Integer)(m->capture[i].start - m->subject) + 1);
    else
        lua_pushlstring(m->L, m->capture[i].start, (size_t)length);
}

/// Pushes every capture, or the whole match `s`…`e` when there are none and `s` is given.
static int sluice_match_push_captures(sluice_match *m, const char *s, const char *e) {
    int n = (m->captures == 0 && s) ? 1 : m->captures;
    luaL_checkstack(m->L, n, "too many captures");
    for (int i = 0; i < n; i++) sluice_match_push_capture(m, i, s, e);
    return n;
}

/// A 1-based start position from argument `arg` (default 1), Lua 5.4's way: negative counts
/// from the end, anything before the start is 1.
static size_t sluice_match_start(lua_State *L, int arg, size_t length) {
    lua_Integer position = luaL_optinteger(L, arg, 1);
    if (position > 0) return (size_t)position;
    if (position == 0 || position < -(lua_Integer)length) return 1;
    return length + (size_t)position + 1;
}

/// Whether pattern `p` has no magic characters (so `find` may search for it as is).
static int sluice_match_is_plain(const char *p, size_t lp) {
    static const char magic[] = "^$*+?.([%-";
    for (size_t i = 0; i < lp; i++)
        if (memchr(magic, p[i], sizeof magic - 1)) return 0;
    return 1;
}

/// The first occurrence of `needle` in `hay`, counting each byte compared; NULL if none.
static const char *sluice_match_plain(sluice_match *m, const char *hay, size_t lh, const char *needle, size_t ln) {
    if (ln == 0) return hay;
    const char *end = hay + lh;
    const char *at = hay;
    while ((size_t)(end - at) >= ln) {
        const char *first = memchr(at, needle[0], (size_t)(end - at) - ln + 1);
        sluice_match_step(m, (first ? first - at : end - at) + 1);
        if (!first) return NULL;
        size_t same = 1;
        while (same < ln) {
            size_t chunk = ln - same < 64 ? ln - same : 64;
            sluice_match_step(m, (long long)chunk);
            if (memcmp(first + same, needle + same, chunk) != 0) break;
            same += chunk;
        }
        if (same == ln) return first;
        at = first + 1;
    }
    return NULL;
}

/// `string.find` (`find`) and `string.match`.
static int sluice_match_find(lua_State *L, int find) {
    size_t ls, lp;
    const char *s = luaL_checklstring(L, 1, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    size_t start = sluice_match_start(L, 3, ls);
    if (start > ls + 1) {
        luaL_pushfail(L);
        return 1;
    }
    sluice_match m;
    sluice_match_init(&m, L, s, ls, p, lp);
    if (find && (lua_toboolean(L, 4) || sluice_match_is_plain(p, lp))) {
        const char *at = sluice_match_plain(&m, s + start - 1, ls - start + 1, p, lp);
        if (at) {
            lua_pushinteger(L, (lua_Integer)(at - s) + 1);
            lua_pushinteger(L, (lua_Integer)(at - s) + (lua_Integer)lp);
            return 2;
        }
    } else {
        int anchored = lp > 0 && *p == '^';
        if (anchored) {
            p++;
            lp--;
        }
        m.pattern_end = p + lp;
        const char *at = s + start - 1;
        for (;;) {
            m.captures = 0;
            m.depth = 0;
            const char *e = sluice_match_at(&m, at, p);
            if (e) {
                if (!find) return sluice_match_push_captures(&m, at, e);
                lua_pushinteger(L, (lua_Integer)(at - s) + 1);
                lua_pushinteger(L, (lua_Integer)(e - s));
                return sluice_match_push_captures(&m, NULL, NULL) + 2;
            }
            if (anchored || at >= m.subject_end) break;
            at++;
        }
    }
    luaL_pushfail(L);
    return 1;
}

static int sluice_lua_str_find(lua_State *L) { return sluice_match_find(L, 1); }
static int sluice_lua_str_match(lua_State *L) { return sluice_match_find(L, 0); }

/// A `gmatch` iterator's state, in a userdata upvalue next to the subject and the pattern
/// (which keep `next`, `last` and `m`'s pointers valid).
typedef struct sluice_gmatch {
    const char *next;  // where the next search starts; NULL: init was past the end, no matches
    const char *last;  // the end of the last match (an empty match may not end there again)
    sluice_match m;
} sluice_gmatch;

static int sluice_gmatch_next(lua_State *L) {
    sluice_gmatch *g = (sluice_gmatch *)lua_touserdata(L, lua_upvalueindex(3));
    size_t lp;
    const char *p = lua_tolstring(L, lua_upvalueindex(2), &lp);
    g->m.L = L;
    if (!g->next) return 0;
    for (const char *at = g->next; at <= g->m.subject_end; at++) {
        g->m.captures = 0;
        g->m.depth = 0;
        const char *e = sluice_match_at(&g->m, at, p);
        if (e && e != g->last) {
            g->next = g->last = e;
            return sluice_match_push_captures(&g->m, at, e);
        }
    }
    return 0;
}

static int sluice_lua_gmatch(lua_State *L) {
    size_t ls, lp;
    const char *s = luaL_checklstring(L, 1, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    size_t start = sluice_match_start(L, 3, ls);
    lua_settop(L, 2);
    sluice_gmatch *g = (sluice_gmatch *)lua_newuserdatauv(L, sizeof *g, 0);
    sluice_match_init(&g->m, L, s, ls, p, lp);
    g->next = start > ls + 1 ? NULL : s + start - 1;
    g->last = NULL;
    lua_pushcclosure(L, sluice_gmatch_next, 3);
    return 1;
}

/// Appends the replacement for the match `s`…`e` to `b`: `repl` (argument 3) of type `kind`.
static void sluice_gsub_replace(sluice_match *m, luaL_Buffer *b, const char *s, const char *e, int kind) {
    lua_State *L = m->L;
    if (kind == LUA_TSTRING || kind == LUA_TNUMBER) {
        size_t lr;
        const char *r = lua_tolstring(L, 3, &lr);
        // A long replacement (`%1` repeated) at every match: its bytes are the work, a step
        // per 16 (a period per 16 KiB, as the bulk functions are charged).
        sluice_match_step(m, (long long)(lr >> 4));
        for (size_t i = 0; i < lr; i++) {
            if (r[i] != '%') {
                luaL_addchar(b, r[i]);
                continue;
            }
            i++;
            if (i < lr && r[i] == '%') {
                luaL_addchar(b, '%');
            } else if (i < lr && isdigit((unsigned char)r[i])) {
                if (r[i] == '0') {
                    luaL_addlstring(b, s, (size_t)(e - s));
                } else {
                    sluice_match_push_capture(m, r[i] - '1', s, e);
                    luaL_tolstring(L, -1, NULL);
                    lua_remove(L, -2);
                    luaL_addvalue(b);
                }
            } else {
                luaL_error(L, "invalid use of '%c' in replacement string", '%');
            }
        }
        return;
    }
    if (kind == LUA_TFUNCTION) {
        lua_pushvalue(L, 3);
        int n = sluice_match_push_captures(m, s, e);
        lua_call(L, n, 1);
    } else {
        sluice_match_push_capture(m, 0, s, e);
        lua_gettable(L, 3);
    }
    if (!lua_toboolean(L, -1)) {
        lua_pop(L, 1);
        luaL_addlstring(b, s, (size_t)(e - s));
    } else if (!lua_isstring(L, -1)) {
        luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
    } else {
        luaL_addvalue(b);
    }
}

static int sluice_lua_str_gsub(lua_State *L) {
    size_t ls, lp;
    const char *s = luaL_checklstring(L, 1, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    int kind = lua_type(L, 3);
    lua_Integer limit = luaL_optinteger(L, 4, (lua_Integer)ls + 1);
    luaL_argexpected(L, kind == LUA_TNUMBER || kind == LUA_TSTRING || kind == LUA_TFUNCTION || kind == LUA_TTABLE, 3,
                     "string/function/table");
    int anchored = lp > 0 && *p == '^';
    if (anchored) {
        p++;
        lp--;
    }
    // The result is about the subject's size, in a lauxlib buffer that grows by doubling
    // (up to about three times its size at once, with the string made from it).
    sluice_lua_make_room(L, 3 * ls);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    sluice_match m;
    sluice_match_init(&m, L, s, ls, p, lp);
    const char *at = s;
    const char *last = NULL;
    lua_Integer count = 0;
    while (count < limit) {
        m.captures = 0;
        m.depth = 0;
        const char *e = sluice_match_at(&m, at, p);
        if (e && e != last) {
            count++;
            sluice_gsub_replace(&m, &b, at, e, kind);
            at = last = e;
        } else if (at < m.subject_end) {
            luaL_addchar(&b, *at++);
        } else {
            break;
        }
        if (anchored) break;
    }
    luaL_addlstring(&b, at, (size_t)(m.subject_end - at));
    luaL_pushresult(&b);
    lua_pushinteger(L, count);
    return 2;
}

#endif

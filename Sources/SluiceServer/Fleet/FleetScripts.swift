/// The Lua scripts the fleet runs in Redis (docs/fleet.md). Each touches the keys of one
/// decision only, named with one hash tag (`{…}`), so they work in Redis Cluster too; the time
/// in each comes from Redis (`TIME`), so the instances' clocks do not matter. Times are in µs
/// (below 2^53, exact in Lua's numbers).
enum FleetScripts {
    /// GCRA for one key under several limits, and the origin's hold (`rate_limit`, scope
    /// fleet). KEYS[1]: the key's TATs, space-separated; KEYS[2]: the hold's end. ARGV[1]:
    /// the number of limits n; then per limit its interval and tolerance (µs); then how long
    /// the request may wait (µs); last, a lease k: when k places would all go now under every
    /// limit (and no hold runs), all k are taken at once. Answers `{1, delay, places}` (go
    /// after `delay` µs; `places` taken: 1, or k) or `{0, retry_after, limit}` (refused;
    /// `limit` 0 is the hold, else 1-based).
    static let acquire = RedisScript(
        """
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
        local n = tonumber(ARGV[1])
        local maxwait = tonumber(ARGV[2 + 2 * n])
        local lease = tonumber(ARGV[3 + 2 * n] or '1')
        local tats = {}
        local stored = redis.call('GET', KEYS[1])
        if stored then
          for v in string.gmatch(stored, '%S+') do tats[#tats + 1] = tonumber(v) end
        end
        if #tats ~= n then tats = {} end
        local delay, binding = 0, -1
        for i = 1, n do
          local tat = tats[i]
          if tat then
            local d = tat - tonumber(ARGV[1 + 2 * i]) - now
            if d > delay then delay, binding = d, i end
          end
        end
        local hold = tonumber(redis.call('GET', KEYS[2]) or '0')
        if hold - now > delay then delay, binding = hold - now, 0 end
        if lease > 1 and delay == 0 and n > 0 then
          -- Would the lease's last place go now too, under every limit?
          local fits = true
          for i = 1, n do
            local tat = tats[i]
            if not tat or tat < now then tat = now end
            if tat + (lease - 1) * tonumber(ARGV[2 * i]) - tonumber(ARGV[1 + 2 * i]) > now then fits = false end
          end
          if not fits then lease = 1 end
        else
          lease = 1
        end
        if delay > maxwait then return {0, delay, binding} end
        if n > 0 then
          local at = now + delay
          local out, last = {}, now
          for i = 1, n do
            local tat = tats[i]
            if not tat or tat < at then tat = at end
            tat = tat + lease * tonumber(ARGV[2 * i])
            out[i] = string.format('%.0f', tat)
            if tat > last then last = tat end
          end
          redis.call('SET', KEYS[1], table.concat(out, ' '), 'PX', math.floor((last - now) / 1000) + 1000)
        end
        return {1, delay, lease}
        """)

    /// The origin asked for no requests of a key for ARGV[1] ms: KEYS[1] holds the hold's end
    /// (µs, Redis's clock) unless a later one is kept already. Answers the end kept.
    static let hold = RedisScript(
        """
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
        local ms = tonumber(ARGV[1])
        local untilus = now + ms * 1000
        local current = tonumber(redis.call('GET', KEYS[1]) or '0')
        if current >= untilus then return string.format('%.0f', current) end
        redis.call('SET', KEYS[1], string.format('%.0f', untilus), 'PX', ms)
        return string.format('%.0f', untilus)
        """)

    /// The token kept under KEYS[1], with its milliseconds left; else whether KEYS[2] (the
    /// fetch lock) is still held: `{token, pttl}`, or 1 / 0.
    static let token = RedisScript(
        """
        local v = redis.call('GET', KEYS[1])
        if v then return {v, redis.call('PTTL', KEYS[1])} end
        return redis.call('EXISTS', KEYS[2])
        """)

    /// Keeps the token ARGV[1] under KEYS[1] for ARGV[2] ms, and deletes the lock KEYS[2] if it
    /// still holds ARGV[3] (this instance's: a lock that expired and went to another is left).
    static let store = RedisScript(
        """
        if ARGV[1] ~= '' then redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2])) end
        if redis.call('GET', KEYS[2]) == ARGV[3] then redis.call('DEL', KEYS[2]) end
        return 1
        """)

    /// Deletes KEYS[1] if it still holds ARGV[1] (a token refused upstream: a newer one that
    /// replaced it meanwhile is kept).
    static let compareAndDelete = RedisScript(
        """
        if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
        return 0
        """)

    /// The trial lock of an origin: KEYS[1] set to this instance (ARGV[1]) for ARGV[2] ms
    /// unless another instance holds it; one this instance holds already (a trial it
    /// abandoned) is taken again. Answers 1 (this instance tries) or 0.
    static let trial = RedisScript(
        """
        local v = redis.call('GET', KEYS[1])
        if v and v ~= ARGV[1] then return 0 end
        redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
        return 1
        """)

    /// An instance's heartbeat: KEYS[1], a sorted set of instances by their last beat (ms);
    /// ARGV[1] the instance, ARGV[2] how long a beat counts (ms). Answers the instances alive.
    ///
    /// With `fleet.cache`'s members from Redis, also KEYS[2], a sorted set of the cache's
    /// members (`ADDRESS WEIGHT`, `FleetMembership`) by their last beat, and ARGV[3] this
    /// instance's entry: the entries older than a beat's life go, and so do this address's
    /// entries with another weight (before a reload); then it answers `{alive, now, {entry,
    /// last beat, …}}`. (Its two keys are in two hash slots: Sluice talks to one Redis server.)
    static let heartbeat = RedisScript(
        """
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        local ttl = tonumber(ARGV[2])
        redis.call('ZADD', KEYS[1], now, ARGV[1])
        redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
        redis.call('PEXPIRE', KEYS[1], ttl * 2)
        local alive = redis.call('ZCARD', KEYS[1])
        if #KEYS < 2 then return alive end
        local me = ARGV[3]
        local address = string.match(me, '^(%S+) ')
        redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - ttl)
        for _, m in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
          if m ~= me and string.match(m, '^(%S+) ') == address then redis.call('ZREM', KEYS[2], m) end
        end
        redis.call('ZADD', KEYS[2], now, me)
        redis.call('PEXPIRE', KEYS[2], ttl * 2)
        return {alive, now, redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')}
        """)
}

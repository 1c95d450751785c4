-- Counts requests per API key in a window shared by every worker of this Sluice
-- (sluice.shared; with `fleet:` configured, by every instance: the fleet's Redis keeps the
-- count, and the hook waits for it); the count goes upstream in
-- X-Request-Count and into the access log's lua.vars, and a key past config.limit is
-- refused (with on_error: fail_closed the client gets 502 and nothing is sent).
--
--   - lua:
--       file: count-per-api-key.lua
--       config: { header: X-Api-Key, window: 60, limit: 1000 }
return {
  on_request = function(req, ctx)
    local key = req.headers:get(ctx.config.header or "X-Api-Key") or "anonymous"
    local count, err = sluice.shared.incr("count:" .. key, 1, ctx.config.window or 60)
    if not count then error(err) end
    ctx.vars.count = count
    if ctx.config.limit and count > ctx.config.limit then
      error("key " .. key .. " is over its limit of " .. ctx.config.limit)
    end
    req.headers:set("X-Request-Count", tostring(count))
  end,
}

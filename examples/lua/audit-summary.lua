-- Sends a summary of each request (method, path, one header) as JSON to an audit endpoint
-- with sluice.http, then lets the request go on. The request waits for the audit's answer
-- (within limits.wall); an audit endpoint that is down or answers an error does not stop it,
-- unless config.required is true (then the client gets 502 and nothing is sent).
--
--   - lua:
--       file: audit-summary.lua
--       allow_hosts: [audit.internal:8080]
--       config: { url: "http://audit.internal:8080/events", header: X-Client-Id }
return {
  on_request = function(req, ctx)
    local header = ctx.config.header or "X-Client-Id"
    local summary = {
      method = req.method,
      path = req.path,
      [header] = req.headers:get(header) or sluice.json.null,
    }
    local res, err = sluice.http{
      method = "POST",
      url = ctx.config.url,
      headers = { ["Content-Type"] = "application/json" },
      body = sluice.json.encode(summary),
      timeout = ctx.config.timeout or 0.5,
    }
    local status = res and res.status or 0
    ctx.vars.audit = status
    if status < 200 or status > 299 then
      local why = err or ("audit answered " .. status)
      if ctx.config.required then error(why) end
      sluice.log.warn(why)
    end
  end,
}

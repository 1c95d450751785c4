-- Drops fields from a JSON response body before the client sees it: each of config.fields is
-- a top-level key, or a path into nested objects with dots (`user.ssn`). Needs
-- read_response_body: true — the body is kept whole (up to limits.body) and the client gets
-- the rewritten one with its new Content-Length. A response that is not JSON, or is
-- compressed (Content-Encoding: res:body() holds the bytes as the origin sent them), goes on
-- unchanged; a body that does not parse is an error (fail_closed: 502). The access log's
-- lua.vars.dropped counts the fields removed.
--
--   - lua:
--       file: drop-json-field.lua
--       read_response_body: true
--       config: { fields: [internal_id, user.ssn] }
return {
  on_response = function(res, ctx)
    local kind = res.headers:get("Content-Type") or ""
    if not (kind:find("^application/json") or kind:find("^application/[%w.-]+%+json")) then return end
    if res.headers:get("Content-Encoding") then return end
    local doc = sluice.json.decode(res:body())
    local dropped = 0
    for _, path in ipairs(ctx.config.fields or {}) do
      local parent, key = doc, path
      while type(parent) == "table" do
        local head, rest = key:match("^([^.]+)%.(.+)$")
        if not head then break end
        parent, key = parent[head], rest
      end
      if type(parent) == "table" and parent[key] ~= nil then
        parent[key] = nil
        dropped = dropped + 1
      end
    end
    ctx.vars.dropped = dropped
    if dropped > 0 then res:set_body(sluice.json.encode(doc)) end
  end,
}

-- Rewrites the request path by a table in config: the first rule whose `from` prefixes the
-- path replaces that prefix with `to`; the query is kept. A path no rule matches goes as is.
--
--   - lua:
--       file: rewrite-path-by-config.lua
--       config:
--         rules:
--           - { from: /api/v1/, to: /v2/ }
--           - { from: /legacy/, to: /archive/ }
return {
  on_request = function(req, ctx)
    for _, rule in ipairs(ctx.config.rules) do
      if req.path:sub(1, #rule.from) == rule.from then
        req.path = rule.to .. req.path:sub(#rule.from + 1)
        ctx.vars.rule = rule.from
        return
      end
    end
  end,
}

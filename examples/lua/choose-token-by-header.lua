-- Chooses the upstream's bearer token by a request header: the client names its tenant in
-- X-Tenant, the policy's config maps tenants to tokens, and the header never reaches the
-- origin. An unknown tenant is an error: with on_error: fail_closed the client gets 502 and
-- nothing is sent.
--
--   - lua:
--       file: choose-token-by-header.lua
--       config: { header: X-Tenant, tokens: { acme: "${ACME_TOKEN}", globex: "${GLOBEX_TOKEN}" } }
return {
  on_request = function(req, ctx)
    local name = ctx.config.header or "X-Tenant"
    local tenant = req.headers:get(name)
    local token = tenant and ctx.config.tokens[tenant]
    if not token then error("no token for tenant " .. tostring(tenant)) end
    req.headers:remove(name)
    req.headers:set("Authorization", "Bearer " .. token)
    ctx.vars.tenant = tenant
  end,
}

-- Signs each try with an HMAC-SHA256 of the request body, in hex, in X-Body-Signature (and
-- the try's time in X-Signed-At, covered by the signature). read_body: true gives the script
-- the body (read whole, up to max_body) and runs it before every try.
--
--   - lua:
--       file: sign-body-hmac.lua
--       read_body: true
--       config: { key: "${SIGNING_KEY}" }
return {
  -- A signer signs each try (read_body implies it; the script says so for readers too).
  every_try = true,
  on_request = function(req, ctx)
    local at = tostring(math.floor(sluice.now()))
    local body = req:body() or ""
    local mac = sluice.hmac_sha256(ctx.config.key, at .. "\n" .. body)
    req.headers:set("X-Signed-At", at)
    req.headers:set("X-Body-Signature", sluice.hex.encode(mac))
  end,
}

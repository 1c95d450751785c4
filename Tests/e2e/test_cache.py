"""The shared cache (docs/caching.md; RFC 9111): `cache_store` and the policy key `cache`,
through the real binary, against a counting origin (cache_origin.py: any status, fields and
body per resource, conditional requests answered as an origin would), httpbin and nginx.
Each rule's test asserts how many requests reached the origin."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from email.utils import formatdate

import pytest
import requests

from cache_origin import CountingOrigin
from conftest import nginx_conf, spawn, stop_process, wait_port
from faultservers import pick_port
from policy_support import AccessLog, monitors
from support import HOST, session_via, wait_until

STORE = {"cache_store": {"memory": "64MiB", "max_object_size": "8MiB"}}


@pytest.fixture
def origin():
    o = CountingOrigin()
    yield o
    o.stop()


@pytest.fixture
def cached(sluice_factory):
    return sluice_factory(STORE)


def get(proxy, url, headers=None, method="GET", **kw):
    return requests.request(method, url, headers=headers or {}, proxies={"http": proxy.url, "https": proxy.url},
                            timeout=15, **kw)


def status_of(r) -> str:
    return r.headers.get("Cache-Status", "")


# ------------------------------------------------------------------------------------------
# Hits and misses
# ------------------------------------------------------------------------------------------

def test_fresh_response_is_served_from_the_cache(cached, origin):
    url = origin.set("/fresh", headers={"Cache-Control": "max-age=60"}, body=b"fresh body")
    first = get(cached, url)
    assert first.status_code == 200 and first.content == b"fresh body"
    assert status_of(first) == "Sluice; fwd=uri-miss; stored", first.headers
    hits = [get(cached, url) for _ in range(5)]
    assert origin.count("/fresh") == 1, "a fresh stored response went to the origin again"
    for r in hits:
        assert r.status_code == 200 and r.content == b"fresh body"
        assert status_of(r).startswith("Sluice; hit; ttl="), r.headers
        assert int(r.headers["Age"]) >= 0 and r.headers["Content-Length"] == "10"
        assert "Via" in r.headers and r.headers["Cache-Control"] == "max-age=60"


def test_no_cache_store_means_no_lookup(sluice_factory, origin):
    proxy = sluice_factory()
    url = origin.set("/plain", headers={"Cache-Control": "max-age=60"})
    for _ in range(3):
        r = get(proxy, url)
        assert r.status_code == 200 and "Cache-Status" not in r.headers
    assert origin.count("/plain") == 3


def test_do_not_cache_host_is_never_stored(sluice_factory, origin):
    proxy = sluice_factory({**STORE, "policies": {HOST: {"cache": "do_not_cache"}}})
    url = origin.set("/dnc", headers={"Cache-Control": "public, max-age=60"})
    for _ in range(3):
        assert "Cache-Status" not in get(proxy, url).headers
    assert origin.count("/dnc") == 3


def test_head_is_answered_from_a_stored_get(cached, origin):
    url = origin.set("/head", headers={"Cache-Control": "max-age=60"}, body=b"x" * 333)
    assert get(cached, url).status_code == 200
    r = get(cached, url, method="HEAD")
    assert r.status_code == 200 and r.content == b"" and r.headers["Content-Length"] == "333"
    assert status_of(r).startswith("Sluice; hit")
    assert origin.count("/head") == 1


def test_large_body_streams_into_and_out_of_the_cache(cached, origin):
    body = os.urandom(5 * 1024 * 1024 + 17)
    url = origin.set("/large", headers={"Cache-Control": "max-age=60"}, body=body)
    assert get(cached, url).content == body
    r = get(cached, url)
    assert hashlib.sha256(r.content).digest() == hashlib.sha256(body).digest()
    assert status_of(r).startswith("Sluice; hit")
    assert origin.count("/large") == 1


def test_object_over_max_object_size_is_served_not_stored(sluice_factory, origin):
    proxy = sluice_factory({"cache_store": {"memory": "4MiB", "max_object_size": "1MiB"}})
    body = os.urandom(1024 * 1024 + 1)
    url = origin.set("/toolarge", headers={"Cache-Control": "max-age=60"}, body=body)
    for _ in range(2):
        r = get(proxy, url)
        assert r.content == body and "stored" not in status_of(r)
    assert origin.count("/toolarge") == 2


# ------------------------------------------------------------------------------------------
# Storability (RFC 9111 §3)
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cc", ["no-store, max-age=60", "private, max-age=60"])
def test_no_store_and_private_responses_are_not_stored(cached, origin, cc):
    url = origin.set("/ns", headers={"Cache-Control": cc})
    for _ in range(2):
        assert "stored" not in status_of(get(cached, url))
    assert origin.count("/ns") == 2


def test_request_no_store_is_not_stored(cached, origin):
    url = origin.set("/rns", headers={"Cache-Control": "max-age=60"})
    get(cached, url, {"Cache-Control": "no-store"})
    get(cached, url)
    assert origin.count("/rns") == 2


def test_authorization_is_stored_only_when_the_response_allows(cached, origin):
    plain = origin.set("/auth", headers={"Cache-Control": "max-age=60"})
    public = origin.set("/auth-public", headers={"Cache-Control": "public, max-age=60"})
    for _ in range(2):
        get(cached, plain, {"Authorization": "Bearer secret"})
        get(cached, public, {"Authorization": "Bearer secret"})
    assert origin.count("/auth") == 2
    assert origin.count("/auth-public") == 1


def test_vary_star_is_never_matched(cached, origin):
    url = origin.set("/star", headers={"Cache-Control": "max-age=60", "Vary": "*"})
    get(cached, url)
    get(cached, url)
    assert origin.count("/star") == 2


def test_heuristic_freshness_from_last_modified(cached, origin):
    lm = formatdate(time.time() - 10 * 86400, usegmt=True)
    url = origin.set("/heur", headers={"Last-Modified": lm, "Date": formatdate(time.time(), usegmt=True)})
    get(cached, url)
    r = get(cached, url)
    assert status_of(r).startswith("Sluice; hit")
    assert origin.count("/heur") == 1


def test_expires_in_the_past_is_stale(cached, origin):
    url = origin.set("/expired", headers={"Expires": "Thu, 01 Jan 1970 00:00:00 GMT"}, conditional=False)
    get(cached, url)
    r = get(cached, url)
    assert status_of(r).startswith("Sluice; fwd=stale"), r.headers
    assert origin.count("/expired") == 2


# ------------------------------------------------------------------------------------------
# Freshness, revalidation, request directives (§4, §5.2.1)
# ------------------------------------------------------------------------------------------

def test_stale_entry_is_revalidated_and_a_304_updates_it(cached, origin):
    url = origin.set("/reval", headers={"Cache-Control": "max-age=0", "ETag": '"v1"', "X-Version": "1"}, body=b"v1 body")
    assert get(cached, url).content == b"v1 body"
    # The origin now says: same representation, fresh for a minute, new metadata.
    origin.set("/reval", headers={"Cache-Control": "max-age=60", "ETag": '"v1"', "X-Version": "2"}, body=b"v1 body")
    r = get(cached, url)
    assert r.status_code == 200 and r.content == b"v1 body", "the 304 was not answered from the stored body"
    assert status_of(r) == "Sluice; fwd=stale; fwd-status=304", r.headers
    assert r.headers["X-Version"] == "2"
    method, sent = origin.requests("/reval")[1]
    assert sent.get("if-none-match") == '"v1"', sent
    r = get(cached, url)
    assert status_of(r).startswith("Sluice; hit") and r.headers["X-Version"] == "2"
    assert origin.count("/reval") == 2


def test_changed_representation_replaces_the_stored_one(cached, origin):
    url = origin.set("/changed", headers={"Cache-Control": "max-age=0", "ETag": '"a"'}, body=b"old")
    get(cached, url)
    origin.set("/changed", headers={"Cache-Control": "max-age=60", "ETag": '"b"'}, body=b"new")
    assert get(cached, url).content == b"new"
    r = get(cached, url)
    assert r.content == b"new" and status_of(r).startswith("Sluice; hit")
    assert origin.count("/changed") == 2


def test_last_modified_validator(cached, origin):
    lm = formatdate(time.time() - 3600, usegmt=True)
    url = origin.set("/lm", headers={"Cache-Control": "max-age=0", "Last-Modified": lm}, body=b"lm")
    get(cached, url)
    r = get(cached, url)
    assert r.content == b"lm" and "fwd-status=304" in status_of(r)
    assert origin.requests("/lm")[1][1].get("if-modified-since") == lm


@pytest.mark.parametrize("request_cc", ["no-cache", "max-age=0"])
def test_request_directives_force_validation(cached, origin, request_cc):
    url = origin.set("/rq", headers={"Cache-Control": "max-age=60", "ETag": '"e"'}, body=b"rq")
    get(cached, url)
    if request_cc == "max-age=0":
        # An age of 0 still satisfies max-age=0 (RFC 9111 §5.2.1.1: "less than or equal").
        assert status_of(get(cached, url, {"Cache-Control": "max-age=5"})).startswith("Sluice; hit")
        time.sleep(1.1)  # time passing: the entry must be a whole second old before max-age=0 refuses it
    r = get(cached, url, {"Cache-Control": request_cc})
    assert r.content == b"rq" and status_of(r) == "Sluice; fwd=request; fwd-status=304"
    assert origin.count("/rq") == 2


def test_pragma_no_cache_forces_validation(cached, origin):
    url = origin.set("/pragma", headers={"Cache-Control": "max-age=60"})
    get(cached, url)
    get(cached, url, {"Pragma": "no-cache"})
    assert origin.count("/pragma") == 2


def test_min_fresh(cached, origin):
    url = origin.set("/minfresh", headers={"Cache-Control": "max-age=60"})
    get(cached, url)
    assert status_of(get(cached, url, {"Cache-Control": "min-fresh=30"})).startswith("Sluice; hit")
    assert status_of(get(cached, url, {"Cache-Control": "min-fresh=120"})).startswith("Sluice; fwd=request")
    assert origin.count("/minfresh") == 2


def test_response_no_cache_is_validated_every_time(cached, origin):
    url = origin.set("/rnc", headers={"Cache-Control": "no-cache", "ETag": '"n"'}, body=b"nc")
    get(cached, url)
    for _ in range(2):
        assert get(cached, url).content == b"nc"
    assert origin.count("/rnc") == 3
    assert all(h.get("if-none-match") == '"n"' for _, h in origin.requests("/rnc")[1:])


def test_max_stale_serves_stale_unless_must_revalidate(cached, origin):
    loose = origin.set("/loose", headers={"Cache-Control": "max-age=0"}, conditional=False)
    strict = origin.set("/strict", headers={"Cache-Control": "max-age=0, must-revalidate"}, conditional=False)
    for url in (loose, strict):
        get(cached, url)
        r = get(cached, url, {"Cache-Control": "max-stale=600"})
    assert origin.count("/loose") == 1, "max-stale did not allow the stale response"
    assert origin.count("/strict") == 2, "must-revalidate was served stale"


def test_only_if_cached_is_504_without_a_stored_response(cached, origin):
    url = origin.set("/oic", headers={"Cache-Control": "max-age=60"})
    r = get(cached, url, {"Cache-Control": "only-if-cached"})
    assert r.status_code == 504 and "only-if-cached" in r.text
    assert origin.count("/oic") == 0
    get(cached, url)
    assert get(cached, url, {"Cache-Control": "only-if-cached"}).status_code == 200
    assert origin.count("/oic") == 1


# ------------------------------------------------------------------------------------------
# Conditional requests from clients, Vary, invalidation
# ------------------------------------------------------------------------------------------

def test_clients_conditional_request_is_answered_304_from_a_fresh_entry(cached, origin):
    lm = formatdate(time.time() - 3600, usegmt=True)
    url = origin.set("/cond", headers={"Cache-Control": "max-age=60", "ETag": '"c1"', "Last-Modified": lm})
    get(cached, url)
    r = get(cached, url, {"If-None-Match": '"c0", "c1"'})
    assert r.status_code == 304 and r.headers["ETag"] == '"c1"' and status_of(r).startswith("Sluice; hit")
    r = get(cached, url, {"If-Modified-Since": lm})
    assert r.status_code == 304
    r = get(cached, url, {"If-None-Match": '"other"'})
    assert r.status_code == 200 and r.content == b"body"
    assert origin.count("/cond") == 1


def test_vary_keeps_one_response_per_variant(cached, origin):
    url = origin.set("/vary", headers={"Cache-Control": "max-age=60", "Vary": "Accept-Language"})
    for lang in ("en", "de", "en", "de", "fr"):
        get(cached, url, {"Accept-Language": lang})
    assert origin.count("/vary") == 3
    r = get(cached, url, {"Accept-Language": "it"})
    assert status_of(r) == "Sluice; fwd=vary-miss; stored"


def test_unsafe_method_invalidates_the_target_and_location(cached, origin):
    item = origin.set("/items/1", headers={"Cache-Control": "max-age=60"})
    listing = origin.set("/items", headers={"Cache-Control": "max-age=60"})
    other = origin.set("/other", headers={"Cache-Control": "max-age=60"})
    for url in (item, listing, other):
        get(cached, url)
        get(cached, url)
    origin.set("/items", status=201, headers={"Location": "/items/1"})
    # (the POST's own resource answers 201 with a Location naming the item)
    r = get(cached, listing, method="POST", data=b"new")
    assert r.status_code == 201
    origin.set("/items", headers={"Cache-Control": "max-age=60"})
    for url in (item, listing, other):
        get(cached, url)
    assert origin.count("/items/1") == 2 and origin.count("/items", "GET") == 2
    assert origin.count("/other") == 1, "a URL the POST did not name was invalidated"


def test_failed_unsafe_method_invalidates_nothing(cached, origin):
    url = origin.set("/keep", headers={"Cache-Control": "max-age=60"})
    get(cached, url)
    origin.set("/keep", status=500, headers={})
    get(cached, url, method="DELETE")
    origin.set("/keep", headers={"Cache-Control": "max-age=60"})
    assert status_of(get(cached, url)).startswith("Sluice; hit")
    assert origin.count("/keep", "GET") == 1


# ------------------------------------------------------------------------------------------
# cache: { modify: … }
# ------------------------------------------------------------------------------------------

def test_modify_rules(sluice_factory, origin):
    proxy = sluice_factory({**STORE, "policies": {HOST: {"cache": {"modify": {
        "freshness": "1m", "ignore_origin_directives": ["private"],
        "drop_response_headers": ["Set-Cookie", "X-Secret"], "key_request_headers": ["X-Tenant"]}}}}})
    url = origin.set("/mod", headers={"Cache-Control": "private, max-age=0", "Set-Cookie": "s=1", "X-Secret": "k"})
    first = get(proxy, url, {"X-Tenant": "a"})
    assert first.headers.get("Set-Cookie") == "s=1", "the origin's own response must reach its client whole"
    hit = get(proxy, url, {"X-Tenant": "a"})
    assert status_of(hit).startswith("Sluice; hit") and "Set-Cookie" not in hit.headers and "X-Secret" not in hit.headers
    get(proxy, url, {"X-Tenant": "b"})
    assert origin.count("/mod") == 2


# ------------------------------------------------------------------------------------------
# Real origins: httpbin and nginx `expires`
# ------------------------------------------------------------------------------------------

def test_httpbin_cache_endpoints(cached, httpbin):
    r1 = get(cached, httpbin.url + "/cache/60")
    r2 = get(cached, httpbin.url + "/cache/60")
    assert r1.status_code == r2.status_code == 200 and r1.content == r2.content
    assert status_of(r2).startswith("Sluice; hit")
    # /response-headers sets what the query names: no-store is honoured.
    url = httpbin.url + "/response-headers?Cache-Control=no-store"
    get(cached, url)
    assert not status_of(get(cached, url)).startswith("Sluice; hit")
    # /etag/{etag} answers If-None-Match itself; the cache answers it from a fresh entry.
    url = httpbin.url + "/response-headers?Cache-Control=max-age%3D60&ETag=%22t1%22"
    get(cached, url)
    r = get(cached, url, {"If-None-Match": '"t1"'})
    assert r.status_code == 304 and status_of(r).startswith("Sluice; hit")
    # /cache without validators from the client: 200 with Last-Modified, heuristically fresh.
    get(cached, httpbin.url + "/cache")
    assert get(cached, httpbin.url + "/cache").status_code == 200


def test_nginx_expires(sluice_factory, tmp_path):
    d = tmp_path / "nginx-exp"
    (d / "www").mkdir(parents=True)
    (d / "www" / "exp.txt").write_bytes(b"expires body")
    port = pick_port()
    conf = d / "nginx.conf"
    conf.write_text(nginx_conf(d, f"""
    server {{
        listen {HOST}:{port};
        root {d / 'www'};
        location / {{ expires 60s; }}
    }}
"""))
    proc = spawn(["nginx", "-p", str(d), "-e", str(d / "error.log"), "-c", str(conf)],
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        wait_port(port, 15, proc)
        proxy = sluice_factory(STORE)
        url = f"http://{HOST}:{port}/exp.txt"
        bodies = [get(proxy, url).content for _ in range(4)]
        assert bodies == [b"expires body"] * 4
        assert wait_until(lambda: (d / "access.log").exists() and (d / "access.log").read_text().count("GET /exp.txt") >= 1, 5)
        time.sleep(0.3)  # window: no second GET of the cached file may reach nginx's log
        assert (d / "access.log").read_text().count("GET /exp.txt") == 1
    finally:
        stop_process(proc)


# ------------------------------------------------------------------------------------------
# The access log's cache field
# ------------------------------------------------------------------------------------------

def test_access_log_cache_field(sluice_factory, origin, tmp_path):
    log_path = tmp_path / "access.log"
    proxy = sluice_factory({**STORE, "monitors": monitors(access=log_path)})
    url = origin.set("/logged", headers={"Cache-Control": "max-age=60"})
    get(proxy, url)
    get(proxy, url)
    lines = AccessLog(log_path).wait_for(lambda e: e.get("url") == url, n=2)
    # (workers buffer their own lines: the two may reach the file in either order)
    by_cache = {e.get("cache", "").split(";")[0]: e for e in lines}
    assert set(by_cache) == {"fwd=uri-miss", "hit"}, lines
    assert by_cache["fwd=uri-miss"]["cache"] == "fwd=uri-miss; stored" and by_cache["fwd=uri-miss"]["attempts"] == 1
    hit = by_cache["hit"]
    assert hit["status"] == 200 and hit["bytes_out"] == 4 and hit["attempts"] == 0 and hit["outcome"] == "ok"


# ------------------------------------------------------------------------------------------
# Range from a complete entry, stale-if-error, gateway routes, chunked bodies
# ------------------------------------------------------------------------------------------

def test_range_is_answered_206_from_a_complete_entry(cached, origin):
    body = bytes(range(256)) * 400  # 102400 bytes: several chunks, some sent by reference
    url = origin.set("/ranged", headers={"Cache-Control": "max-age=60"}, body=body)
    get(cached, url)
    for spec, (first, last) in {"bytes=0-9": (0, 9), "bytes=70000-": (70000, len(body) - 1),
                                "bytes=-100": (len(body) - 100, len(body) - 1),
                                "bytes=1000-90000": (1000, 90000)}.items():
        r = get(cached, url, {"Range": spec})
        assert r.status_code == 206, (spec, r.status_code)
        assert r.headers["Content-Range"] == f"bytes {first}-{last}/{len(body)}"
        assert r.content == body[first:last + 1], spec
    r = get(cached, url, {"Range": f"bytes={len(body)}-"})
    assert r.status_code == 416 and r.headers["Content-Range"] == f"bytes */{len(body)}"
    r = get(cached, url, {"Range": "bytes=0-1,5-6"})  # several ranges: the whole response
    assert r.status_code == 200 and r.content == body
    assert origin.count("/ranged") == 1


def test_if_range_is_answered_from_the_entry(cached, origin):
    """RFC 9110 §13.1.5: the range when the client's validator is the stored one (a strong
    ETag, or a strong Last-Modified date), the whole 200 when it is another; the origin sees
    none of them."""
    body = os.urandom(5000)
    modified = "Wed, 01 Jan 2025 00:00:00 GMT"
    url = origin.set("/ifr", headers={"Cache-Control": "max-age=60", "ETag": '"v1"', "Last-Modified": modified},
                     body=body)
    assert get(cached, url).content == body
    for validator in ('"v1"', modified):
        r = get(cached, url, {"Range": "bytes=100-199", "If-Range": validator})
        assert r.status_code == 206 and r.content == body[100:200], (validator, r.status_code)
        assert r.headers["Content-Range"] == f"bytes 100-199/{len(body)}"
    for other in ('"v0"', 'W/"v1"', "Thu, 02 Jan 2025 00:00:00 GMT", "not a validator"):
        r = get(cached, url, {"Range": "bytes=100-199", "If-Range": other})
        assert r.status_code == 200 and r.content == body and "Content-Range" not in r.headers, other
    assert all(s.startswith("Sluice; hit") for s in [get(cached, url, {"Range": "bytes=0-0", "If-Range": '"v1"'})
                                                      .headers["Cache-Status"]])
    assert origin.count("/ifr") == 1


def test_stale_if_error_serves_the_stored_response(sluice_factory, origin):
    proxy = sluice_factory(STORE)
    url = origin.set("/sie", headers={"Cache-Control": "max-age=0, stale-if-error=600"}, body=b"good", conditional=False)
    strict = origin.set("/nosie", headers={"Cache-Control": "max-age=0"}, body=b"good", conditional=False)
    get(proxy, url)
    get(proxy, strict)
    origin.set("/sie", status=503, headers={}, body=b"down")
    origin.set("/nosie", status=503, headers={}, body=b"down")
    r = get(proxy, url)
    assert r.status_code == 200 and r.content == b"good" and status_of(r) == "Sluice; fwd=stale; fwd-status=503"
    r = get(proxy, strict)
    assert r.status_code == 503 and r.content == b"down"
    assert origin.count("/sie") == 2 and origin.count("/nosie") == 2


def test_stale_if_error_when_the_origin_is_gone(sluice_factory):
    o = CountingOrigin()
    # Connection: close, so that no pooled connection to the stopped origin outlives it.
    url = o.set("/gone", headers={"Cache-Control": "max-age=0, stale-if-error=600", "Connection": "close"},
                body=b"kept", conditional=False)
    proxy = sluice_factory(STORE)
    assert get(proxy, url).content == b"kept"
    o.stop()  # nothing listens there any more: the revalidation cannot connect
    r = get(proxy, url)
    assert r.status_code == 200 and r.content == b"kept" and status_of(r) == "Sluice; fwd=stale; fwd-status=502"


def test_gateway_route_responses_are_cached(sluice_factory, origin):
    route_port = pick_port()
    proxy = sluice_factory({**STORE, "routes": [{"listen": f"{HOST}:{route_port}", "upstream": origin.url("/api")}]})
    origin.set("/api/thing", headers={"Cache-Control": "max-age=60"}, body=b"thing")
    assert wait_until(lambda: proxy.proc.poll() is None, 1)
    for _ in range(3):
        r = requests.get(f"http://{HOST}:{route_port}/thing", timeout=10)
        assert r.content == b"thing"
    assert status_of(r).startswith("Sluice; hit")
    assert origin.count("/api/thing") == 1


def test_chunked_body_of_unknown_length_is_stored(cached, origin):
    body = os.urandom(300_000)
    url = origin.set("/chunked", headers={"Cache-Control": "max-age=60"}, body=body, chunked=True)
    first = get(cached, url)
    assert first.content == body and status_of(first) == "Sluice; fwd=uri-miss; stored"
    second = get(cached, url)
    assert second.content == body and second.headers["Content-Length"] == str(len(body))
    assert status_of(second).startswith("Sluice; hit")
    assert origin.count("/chunked") == 1


def test_chunked_body_over_max_object_size_is_given_up_while_streaming(sluice_factory, origin):
    proxy = sluice_factory({"cache_store": {"memory": "4MiB", "max_object_size": "100KiB"}})
    body = os.urandom(300_000)
    url = origin.set("/chunked-big", headers={"Cache-Control": "max-age=60"}, body=body, chunked=True)
    for _ in range(2):
        assert get(proxy, url).content == body
    assert origin.count("/chunked-big") == 2


# ------------------------------------------------------------------------------------------
# Collapsed forwarding
# ------------------------------------------------------------------------------------------

def test_concurrent_misses_for_one_cold_url_reach_the_origin_once(sluice_factory, origin):
    proxy = sluice_factory({**STORE, "workers": 2})
    body = os.urandom(50_000)
    # The origin answers after 3 s: 100 threads on a loaded 2-core machine took more than 1 s
    # to all send, and a request that arrives after the store is a plain hit, not collapsed.
    url = origin.set("/cold", headers={"Cache-Control": "max-age=60"}, body=body, delay=3.0)

    def one(_):
        r = get(proxy, url)
        return r.status_code, hashlib.sha256(r.content).hexdigest(), status_of(r)

    with ThreadPoolExecutor(max_workers=100) as pool:
        results = list(pool.map(one, range(100), timeout=60))
    assert {(code, digest) for code, digest, _ in results} == {(200, hashlib.sha256(body).hexdigest())}
    assert origin.count("/cold") == 1, f"{origin.count('/cold')} requests reached the origin"
    statuses = [cs for _, _, cs in results]
    assert sum(cs == "Sluice; fwd=uri-miss; stored" for cs in statuses) == 1, statuses
    assert sum("collapsed" in cs for cs in statuses) >= 90, statuses


def test_waiting_requests_go_to_the_origin_when_the_response_is_not_storable(sluice_factory, origin):
    proxy = sluice_factory(STORE)
    url = origin.set("/uncacheable", headers={"Cache-Control": "no-store"}, delay=0.5)
    with ThreadPoolExecutor(max_workers=10) as pool:
        codes = list(pool.map(lambda _: get(proxy, url).status_code, range(10), timeout=60))
    assert codes == [200] * 10
    assert origin.count("/uncacheable") == 10


# ------------------------------------------------------------------------------------------
# What the operator sees: GET /config, sluice check, the disk tier's refusal
# ------------------------------------------------------------------------------------------

def test_admin_config_metrics_and_check_show_the_cache(sluice_factory, origin):
    import test_admin  # the module (not its names: pytest would collect its tests here again)
    proxy, admin = test_admin.admin_proxy(sluice_factory, {
        **STORE, "monitors": [{"metrics": {}}],
        "policies": {"a.test": {"cache": "do_not_cache"},
                     "b.test": {"cache": {"modify": {"ignore_origin_directives": ["private"]}}}}})
    url = origin.set("/metered", headers={"Cache-Control": "max-age=60"})
    for _ in range(3):
        get(proxy, url)
    metrics = test_admin.scrape(admin)
    assert metrics.get('sluice_cache_total{event="lookup"}') == 3, metrics
    assert metrics.get('sluice_cache_total{event="hit"}') == 2
    assert metrics.get('sluice_cache_total{event="miss"}') == 1
    assert metrics.get('sluice_cache_total{event="stored"}') == 1
    status, config, _ = admin.call("GET", "/config")  # validated against docs/admin-api.yaml
    assert status == 200 and config["server"]["cache_store"] == {"memory": 64 << 20, "max_object_size": 8 << 20}
    described = {p["name"]: p["description"] for p in config["policies"]}
    assert "cache: do_not_cache" in described["a.test"]
    assert any(line.startswith("cache: modify: IGNORES origin private") for line in described["b.test"]), described
    # ... and the log says so at start, as loudly as disabled trust
    assert "policy 'b.test': the shared cache IGNORES the origin's private" in proxy.stderr(), proxy.stderr()


def test_disk_tier_bad_size_is_located(sluice_bin, tmp_path):
    # The disk tier itself: test_cache_disk.py.
    path = tmp_path / "disk.yaml"
    path.write_text(f"listen: ['127.0.0.1:3999']\ncache_store:\n  memory: 1MiB\n  disk: {{ path: {tmp_path}/c, size: lots }}\n")
    r = subprocess.run([sluice_bin, "check", "--config", str(path)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert f"{path}:4:" in r.stderr + r.stdout and "cache_store.disk.size must be a size" in r.stderr + r.stdout, r.stderr


def test_age_grows_while_stored(cached, origin):
    url = origin.set("/aging", headers={"Cache-Control": "max-age=60", "Age": "5"})
    get(cached, url)
    time.sleep(1.2)  # time passing: the stored response must age at least a second
    r = get(cached, url)
    assert status_of(r).startswith("Sluice; hit")
    assert int(r.headers["Age"]) >= 6, r.headers  # the origin's 5 plus at least 1 s in the store
    assert int(status_of(r).split("ttl=")[1]) <= 54
    assert origin.count("/aging") == 1


def test_policy_credentials_count_as_authorization(sluice_factory, origin):
    proxy = sluice_factory({**STORE, "policies": {HOST: {"adapters": [{"bearer": "policy-token"}]}}})
    private = origin.set("/policy-auth", headers={"Cache-Control": "max-age=60"})
    public = origin.set("/policy-auth-public", headers={"Cache-Control": "public, max-age=60"})
    for _ in range(2):
        get(proxy, private)
        get(proxy, public)
    assert origin.requests("/policy-auth")[0][1].get("authorization") == "Bearer policy-token"
    assert origin.count("/policy-auth") == 2, "a response to the policy's credentials was shared"
    assert origin.count("/policy-auth-public") == 1


# ------------------------------------------------------------------------------------------
# stale-while-revalidate (RFC 5861 §3) and an open circuit (health:) answered stale
# ------------------------------------------------------------------------------------------

def test_stale_while_revalidate_serves_stale_at_once_and_revalidates_once(sluice_factory, origin):
    proxy = sluice_factory({**STORE, "workers": 2})
    url = origin.set("/swr", headers={"Cache-Control": "max-age=1, stale-while-revalidate=600", "ETag": '"v1"',
                                      "X-Version": "1"}, body=b"swr body")
    assert get(proxy, url).content == b"swr body"
    time.sleep(2.2)  # time passing: max-age=1 runs out; stale now, well inside the window
    # The origin is slow (5 s) to revalidate and will say: same body, fresh for a minute, new metadata.
    origin.set("/swr", headers={"Cache-Control": "max-age=60", "ETag": '"v1"', "X-Version": "2"}, body=b"swr body",
               delay=5.0)

    def one(_):
        started = time.monotonic()
        r = requests.get(url, proxies={"http": proxy.url}, headers={"Connection": "close"}, timeout=15)
        return r, time.monotonic() - started

    with ThreadPoolExecutor(max_workers=10) as pool:
        answers = list(pool.map(one, range(20)))
    for r, took in answers:
        assert r.status_code == 200 and r.content == b"swr body" and r.headers["X-Version"] == "1", r.headers
        status = status_of(r)
        assert status.startswith("Sluice; hit; fwd=stale; ttl=-") and "detail=stale-while-revalidate" in status, status
        assert int(r.headers["Age"]) >= 2, r.headers
        assert took < 4.0, f"a stale answer waited for the revalidation ({took:.1f} s)"
    # Exactly one background revalidation reached the origin, with the stored validator.
    assert wait_until(lambda: origin.count("/swr") == 2, 10), origin.count("/swr")
    _, sent = origin.requests("/swr")[1]
    assert sent.get("if-none-match") == '"v1"', sent
    # The 304 made the entry fresh: a hit with the new metadata, no further origin request.
    assert wait_until(lambda: get(proxy, url).headers.get("X-Version") == "2", 15)
    r = get(proxy, url)
    assert status_of(r).startswith("Sluice; hit; ttl=") and r.content == b"swr body", r.headers
    time.sleep(0.5)  # window: no second revalidation may reach the origin
    assert origin.count("/swr") == 2, "more than one revalidation reached the origin"


def test_stale_while_revalidate_replaces_the_entry_after_the_client_left(sluice_factory, origin):
    proxy = sluice_factory(STORE)
    url = origin.set("/swr-new", headers={"Cache-Control": "max-age=1, stale-while-revalidate=600"}, body=b"old",
                     conditional=False)
    assert get(proxy, url).content == b"old"
    time.sleep(2.2)  # time passing: max-age=1 runs out, the entry is stale inside its window
    origin.set("/swr-new", headers={"Cache-Control": "max-age=60"}, body=b"new representation", conditional=False,
               delay=1.0)
    # A client sends the request and leaves at once: the background fetch is not its own.
    s = socket.create_connection((HOST, proxy.port), timeout=5)
    s.sendall(f"GET {url} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
    s.close()
    assert wait_until(lambda: origin.count("/swr-new") == 2, 10)
    assert wait_until(lambda: get(proxy, url).content == b"new representation", 10)
    r = get(proxy, url)
    assert status_of(r).startswith("Sluice; hit; ttl=") and r.content == b"new representation"
    assert origin.count("/swr-new") == 2


def test_a_background_revalidation_is_a_try_that_takes_its_rate_limit_turn(sluice_factory, origin):
    # `rate: 2/h`: the fill takes the first turn, the first background revalidation the
    # second (counted as a try of its own); the next stale hit finds no turn left, so no
    # background request goes out — the stale answer is still served at once.
    from test_metric_values import scrape, value
    admin = pick_port()
    proxy = sluice_factory({**STORE, "admin": {"listen": f"{HOST}:{admin}"}, "monitors": [{"metrics": {}}],
                            "policies": {HOST: {"rate_limit": {"rate": "2/h", "burst": 2}}}})
    headers = {"Cache-Control": "max-age=1, stale-while-revalidate=600", "ETag": '"r1"'}
    url = origin.set("/swr-turn", headers=headers, body=b"turn")
    assert get(proxy, url).content == b"turn"
    for expected in (2, 2):
        time.sleep(2.2)  # time passing: max-age=1 runs out; stale inside the window
        r = get(proxy, url)
        assert r.status_code == 200 and "detail=stale-while-revalidate" in status_of(r), r.headers
        assert wait_until(lambda: origin.count("/swr-turn") == expected, 5), origin.count("/swr-turn")
    time.sleep(0.5)  # window: a revalidation without a turn must not reach the origin
    assert origin.count("/swr-turn") == 2
    samples = scrape(admin)
    assert value(samples, "sluice_upstream_tries_total", kind="revalidation") == 1
    assert value(samples, "sluice_rate_limit_decisions_total", policy=HOST, decision="allowed") == 2


def test_stale_while_revalidate_is_not_used_when_forbidden(cached, origin):
    url = origin.set("/swr-mr", headers={"Cache-Control": "max-age=1, stale-while-revalidate=600, must-revalidate",
                                         "ETag": '"m"'}, body=b"m")
    get(cached, url)
    time.sleep(2.2)  # time passing: max-age=1 runs out, the entry is stale inside its window
    r = get(cached, url)
    assert status_of(r) == "Sluice; fwd=stale; fwd-status=304", r.headers  # a blocking revalidation
    url = origin.set("/swr-ms", headers={"Cache-Control": "max-age=1, stale-while-revalidate=600", "ETag": '"s"'},
                     body=b"s")
    get(cached, url)
    time.sleep(2.2)  # time passing: max-age=1 runs out, the entry is stale inside its window
    r = get(cached, url, headers={"Cache-Control": "max-stale=0"})  # the client bounds staleness below it
    assert status_of(r) == "Sluice; fwd=stale; fwd-status=304", r.headers
    assert origin.count("/swr-mr") == 2 and origin.count("/swr-ms") == 2


def test_open_circuit_is_answered_stale_from_the_cache(sluice_factory, origin, tmp_path):
    log_path = tmp_path / "access.log"
    proxy = sluice_factory({**STORE, "workers": 2, "monitors": monitors(access=log_path),
                            "policies": {HOST: {"health": {"consecutive_failures": 2, "cooldown": "60s"}}}})
    cached_url = origin.set("/kept", headers={"Cache-Control": "max-age=1", "ETag": '"k"'}, body=b"kept body")
    strict_url = origin.set("/strict", headers={"Cache-Control": "max-age=1, must-revalidate"}, body=b"strict")
    swr_url = origin.set("/swr-open", headers={"Cache-Control": "max-age=1, stale-while-revalidate=600"}, body=b"swr")
    assert get(proxy, cached_url).content == b"kept body" and get(proxy, strict_url).content == b"strict"
    assert get(proxy, swr_url).content == b"swr"
    origin.set("/fail", status=503, headers={}, body=b"down")
    for _ in range(2):
        assert get(proxy, origin.url("/fail")).status_code == 503
    time.sleep(2.2)  # time passing: max-age=1 runs out, both stored responses are stale now
    before = len(origin.log)
    r = get(proxy, cached_url)
    assert r.status_code == 200 and r.content == b"kept body", (r.status_code, r.content)
    assert status_of(r) == "Sluice; fwd=stale; fwd-status=503; detail=circuit-open", r.headers
    assert int(r.headers["Age"]) >= 2
    # must-revalidate, an uncached URL, and a client asking for validation: the circuit's 503.
    for url, headers in [(strict_url, {}), (origin.url("/never-stored"), {}), (cached_url, {"Cache-Control": "no-cache"}),
                         (cached_url, {"Cache-Control": "max-stale=0"})]:
        r = get(proxy, url, headers=headers)
        assert r.status_code == 503 and "circuit is open" in r.text and "Retry-After" in r.headers, (url, headers, r.text)
    # Inside a stale-while-revalidate window: served stale, and no background revalidation
    # goes to the origin while its circuit is open.
    for _ in range(3):
        r = get(proxy, swr_url)
        assert r.status_code == 200 and "detail=stale-while-revalidate" in status_of(r), r.headers
    time.sleep(0.5)  # window: no background revalidation may reach the origin while its circuit is open
    assert len(origin.log) == before, "a request reached the origin while its circuit was open"
    lines = AccessLog(log_path).wait_for(lambda e: e.get("url") == cached_url and e.get("status") == 200, n=2)
    stale = [e for e in lines if "circuit-open" in e.get("cache", "")]
    assert len(stale) == 1 and stale[0]["circuit"] == "open", lines


# Review fixes
# ------------------------------------------------------------------------------------------

def test_a_304s_set_cookie_reaches_its_client_but_is_not_stored(cached, origin):
    url = origin.set("/r304", headers={"Cache-Control": "max-age=0", "ETag": '"v1"'}, body=b"shared")
    assert "stored" in status_of(get(cached, url))
    # The validating 304 carries a cookie (and makes the entry fresh).
    origin.set("/r304", headers={"Cache-Control": "max-age=60", "ETag": '"v1"', "Set-Cookie": "s=alice"}, body=b"shared")
    alice = get(cached, url)
    assert alice.content == b"shared" and "fwd-status=304" in status_of(alice)
    assert alice.headers.get("Set-Cookie") == "s=alice", "the revalidating client gets the 304's fields"
    bob = get(cached, url)
    assert bob.content == b"shared" and status_of(bob).startswith("Sluice; hit"), bob.headers
    assert "Set-Cookie" not in bob.headers, "one client's cookie was stored and served to another"
    assert origin.count("/r304") == 2


@pytest.mark.parametrize("cc", ["private, max-age=60", "no-store"])
def test_a_304_that_forbids_storing_drops_the_entry(cached, origin, cc):
    url = origin.set("/r304p", headers={"Cache-Control": "max-age=0", "ETag": '"v1"'}, body=b"once shared")
    get(cached, url)
    origin.set("/r304p", headers={"Cache-Control": cc, "ETag": '"v1"'}, body=b"once shared")
    first = get(cached, url)
    assert first.content == b"once shared" and first.headers["Cache-Control"] == cc
    second = get(cached, url)
    assert second.content == b"once shared" and not status_of(second).startswith("Sluice; hit")
    assert origin.count("/r304p") == 3, "an entry the 304 made private/no-store was still served"


def test_a_304_passes_drop_response_headers(sluice_factory, origin):
    proxy = sluice_factory({**STORE, "policies": {HOST: {"cache": {"modify": {"drop_response_headers": ["X-Secret"]}}}}})
    url = origin.set("/r304d", headers={"Cache-Control": "max-age=0", "ETag": '"v1"'})
    get(proxy, url)
    origin.set("/r304d", headers={"Cache-Control": "max-age=60", "ETag": '"v1"', "X-Secret": "k"})
    assert get(proxy, url).headers.get("X-Secret") == "k"
    hit = get(proxy, url)
    assert status_of(hit).startswith("Sluice; hit") and "X-Secret" not in hit.headers
    assert origin.count("/r304d") == 2


def test_a_followed_redirect_is_not_stored_under_the_original_url(sluice_factory, origin):
    proxy = sluice_factory({**STORE, "policies": {HOST: {"redirect": {"follow": {"max": 5}}}}})
    target = origin.set("/final", headers={"Cache-Control": "max-age=60"}, body=b"final")
    url = origin.set("/moved", status=302, headers={"Location": target})
    for _ in range(2):
        r = get(proxy, url, allow_redirects=False)
        assert r.status_code == 200 and r.content == b"final" and "stored" not in status_of(r)
        assert not status_of(r).startswith("Sluice; hit")
    assert origin.count("/moved") == 2 and origin.count("/final") == 2
    # Both URLs are fetched again afterwards (no claim is left behind), the target directly.
    direct = get(proxy, target)
    assert direct.content == b"final" and "stored" in status_of(direct)
    assert origin.count("/final") == 3


def test_content_length_beside_chunked_is_ignored(sluice_factory, origin):
    """libcurl lets `Transfer-Encoding` override a `Content-Length` beside it (RFC 9112 §6.3
    allows that of a recipient); the cache must then store the decoded body, not the length.
    The native transport refuses such a response instead (next test)."""
    cached = sluice_factory({**STORE, "policies": {"default": {"upstream": {"engine": "curl"}}}})
    body = os.urandom(2 * 1024 * 1024)
    url = origin.set("/tecl", headers={"Cache-Control": "max-age=60", "Content-Length": "1"}, body=body, chunked=True)
    first = get(cached, url)
    assert first.content == body and "stored" in status_of(first)
    second = get(cached, url)
    assert status_of(second).startswith("Sluice; hit") and second.content == body
    assert second.headers["Content-Length"] == str(len(body))
    assert origin.count("/tecl") == 1


def test_content_length_beside_chunked_is_refused_and_not_stored_natively(sluice_factory, origin):
    """The native transport (the default for http origins) answers a response with both
    framings 502 (a smuggling vector), and nothing of it is stored."""
    cached = sluice_factory({**STORE, "policies": {"default": {"upstream": {"engine": "native"}}}})
    url = origin.set("/tecl-native", headers={"Cache-Control": "max-age=60", "Content-Length": "1"},
                     body=b"x" * 4096, chunked=True)
    for _ in range(2):
        r = get(cached, url)
        assert r.status_code == 502 and r.content.startswith(b"sluice: "), r.content
        assert "stored" not in status_of(r) and not status_of(r).startswith("Sluice; hit")
    assert origin.count("/tecl-native") == 2


def test_get_with_a_body_is_neither_looked_up_nor_stored(cached, origin):
    url = origin.set("/gbody", headers={"Cache-Control": "max-age=60"}, body=b"for the body")
    with_body = get(cached, url, data=b"x=1")
    assert with_body.content == b"for the body" and "stored" not in status_of(with_body)
    origin.set("/gbody", headers={"Cache-Control": "max-age=60"}, body=b"plain")
    plain = get(cached, url)
    assert plain.content == b"plain" and "stored" in status_of(plain)
    assert get(cached, url).content == b"plain"
    again = get(cached, url, data=b"x=2")  # not answered from the entry, does not replace it
    assert not status_of(again).startswith("Sluice; hit")
    assert get(cached, url).content == b"plain"
    assert origin.count("/gbody") == 3


def test_a_non_2xx_entry_never_answers_304(cached, origin):
    url = origin.set("/gone", status=404, headers={"Cache-Control": "max-age=60", "ETag": '"x"'}, body=b"not here",
                     conditional=False)
    assert get(cached, url).status_code == 404
    r = get(cached, url, {"If-None-Match": '"x"'})
    assert r.status_code == 404 and r.content == b"not here" and status_of(r).startswith("Sluice; hit")
    assert origin.count("/gone") == 1


def test_invalidation_cancels_a_fill_in_progress(cached, origin):
    body = b"a" * 4096 + b"b" * 4096 + b"c" * 4096
    url = origin.set("/slow", headers={"Cache-Control": "max-age=60"}, body=body, chunked=True, trickle=1.0)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(get, cached, url, stream=True)  # returns at the head, the body still to come
        assert wait_until(lambda: origin.count("/slow", "GET") == 1, 5)
        old = pending.result(timeout=20)  # the head reached the client: the fill is in progress
        post = requests.post(url, data=b"change", proxies={"http": cached.url}, timeout=15)
        assert post.status_code == 200
    assert old.content == body
    r = get(cached, url)
    assert r.content == body and not status_of(r).startswith("Sluice; hit"), "the pre-POST body was stored"
    assert origin.count("/slow", "GET") == 2

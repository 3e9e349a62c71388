"""Fuzzing the gateway against a live 1P+1D fleet: not one answer may be a 5xx.

* schemathesis: requests generated from the gateway's OpenAPI document, a bounded number per operation;
* hypothesis: raw bodies the schema never produces (bytes that are not UTF-8, JSON with lone surrogates, deep
  nesting, integers past Python's digit limit, values of the wrong type in every field, floats that round to 0
  in float32), all on one keep-alive connection, which must stay usable after every answer; each answer is
  counted in trtpd_gateway_requests_total."""

from __future__ import annotations

import http.client
import json
import re
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtpd.deploy.spec import ReferenceDeployment

from .conftest import auth, fleet_with_gateway, fuzz_openapi

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def fleet(trtpd_home, fp16_root):
    with fleet_with_gateway("gw-fuzz", ReferenceDeployment(fp16_root), prefill=1, decode=1) as fleet:
        yield fleet


def test_no_generated_request_gets_a_server_error(fleet):
    """Each operation of the OpenAPI document, 30 generated cases (derandomized: the same cases every run)."""
    checked = fuzz_openapi(f"http://127.0.0.1:{fleet.gateway['port']}", auth(fleet), 30)
    assert len(checked) >= 5 * 10 and any(code == 200 for code in checked)
    print(f"schemathesis: {len(checked)} generated requests, status codes {sorted(set(checked))}")


FIELDS = ["model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "n",
          "user", "best_of", "logprobs", "echo", "ignore_eos", "presence_penalty", "messages", "junk"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                    st.floats(min_value=1e-320, max_value=1e-39), st.text(max_size=20),
                    st.sampled_from(["\\ud800", "a\\udfffb", "tiny-llama"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.sampled_from(FIELDS), inner, max_size=3)),
                      max_leaves=8)


def _json(value) -> bytes:
    """JSON text with the sampled escape strings left as escapes (a lone surrogate arrives as JSON allows it)."""
    return json.dumps(value).replace("\\\\u", "\\u").encode()


bodies = st.one_of(
    st.binary(max_size=200),
    st.builds(_json, st.dictionaries(st.sampled_from(FIELDS), values, max_size=6)),
    st.builds(lambda d, base: _json({"model": "tiny-llama", "prompt": "x", "max_tokens": 2, **d}),
              st.dictionaries(st.sampled_from(FIELDS[2:]), values, max_size=3), st.none()),
    st.builds(lambda n: b'{"model": "tiny-llama", "prompt": ' + b"[" * n + b"]" * n + b"}",
              st.integers(1000, 200000)),
    st.builds(lambda n: b'{"model": "tiny-llama", "prompt": "x", "seed": ' + b"9" * n + b"}", st.integers(4000, 9000)),
)


def _counted(fleet) -> dict[str, float]:
    req = urllib.request.Request(f"http://127.0.0.1:{fleet.gateway['port']}/metrics", headers=auth(fleet))
    text = urllib.request.urlopen(req, timeout=10).read().decode()
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r'trtpd_gateway_requests_total\{endpoint="/v1/completions",status="(\d+)"\} (\S+)', text)}


def test_raw_bodies_get_4xx_on_a_connection_that_stays_usable(fleet):
    conn = http.client.HTTPConnection("127.0.0.1", fleet.gateway["port"], timeout=60)
    headers = {"Content-Type": "application/json", **auth(fleet)}
    before = _counted(fleet)
    sent: list[int] = []

    @given(body=bodies)
    @settings(max_examples=150, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def check(body):
        conn.request("POST", "/v1/completions", body=body, headers=headers)
        response = conn.getresponse()
        text = response.read()
        assert response.status < 500, (body[:200], response.status, text[:300])
        if response.status >= 400:
            assert json.loads(text)["error"]["message"], text
        assert response.getheader("connection") != "close" or response.status == 413, (body[:200], text[:200])
        sent.append(response.status)
    check()
    conn.request("GET", "/v1/models", headers=headers)   # the same connection still serves
    assert conn.getresponse().status == 200 and len(sent) >= 100
    after = _counted(fleet)
    for status in set(sent):
        assert after.get(str(status), 0) - before.get(str(status), 0) == sent.count(status), status
    print(f"raw bodies: {len(sent)}, status codes {sorted(set(sent))}")

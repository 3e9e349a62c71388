"""Schema-driven fuzzing of the gateway's OpenAPI document (schemathesis) against a live 1P+1D fleet:
a bounded number of generated requests per operation, and not one answer may be a 5xx."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from trtpd.deploy.spec import ReferenceDeployment

from .conftest import fleet_with_gateway

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def gateway_schema(trtpd_home, fp16_root):
    with fleet_with_gateway("gw-fuzz", ReferenceDeployment(fp16_root), prefill=1, decode=1) as fleet:
        yield schemathesis.openapi.from_url(f"http://127.0.0.1:{fleet.gateway['port']}/openapi.json")


def test_no_generated_request_gets_a_server_error(gateway_schema):
    """Each operation of the OpenAPI document, 30 generated cases (derandomized: the same cases every run)."""
    from hypothesis import given

    checked = []
    for result in gateway_schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=30, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case):
            response = case.call(timeout=120)
            assert response.status_code < 500, f"{case.method} {case.path} {case.body!r} -> " \
                                               f"{response.status_code} {response.text[:300]}"
            if case.path.startswith("/v1/") and case.method == "POST" and response.status_code >= 400:
                assert response.json()["error"]["message"]   # an OpenAI error body that says what is wrong
            checked.append(response.status_code)
        check()
    assert len(checked) >= 5 * 10 and any(code == 200 for code in checked)
    print(f"schemathesis: {len(checked)} generated requests, status codes {sorted(set(checked))}")

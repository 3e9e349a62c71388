"""The controller's calls to the gateway (trtpd/gateway/app.py): drain or restore an instance, reload the fleet
file, read each instance's load from /health. Standard library HTTP; the token is the gateway's admin token,
derived from the deployment key as FleetService.admin_token derives it."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from trtpd.errors import TrtpdError
from trtpd.kv.auth import gateway_admin_token


def admin_token(kv_key: bytes) -> str:
    return gateway_admin_token(kv_key)


class GatewayAdmin:
    def __init__(self, url: str, token: str, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Authorization": f"Bearer {self.token}",
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                return answer.status, json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")
        except (urllib.error.URLError, OSError) as exc:
            raise TrtpdError(f"gateway {self.url}: {method} {path} failed ({exc}); is the gateway Service "
                             f"reachable from the controller?") from None

    def set_state(self, name: str, state: str) -> None:
        """PUT /admin/instances/{name}. 404 (the gateway has no such instance yet) is fine: it routes nothing there."""
        status, body = self._call("PUT", f"/admin/instances/{name}", {"state": state})
        if status not in (200, 404):
            raise TrtpdError(f"gateway {self.url} refused to mark {name} {state}: {status} {body}")

    def reload(self) -> None:
        status, body = self._call("POST", "/admin/reload")
        if status != 200:
            raise TrtpdError(f"gateway {self.url} refused to reload its fleet file: {status} {body}")

    def health(self) -> dict | None:
        """The gateway's /health body (200 or 503 alike); None when it cannot be reached."""
        try:
            return self._call("GET", "/health")[1]
        except TrtpdError:
            return None

    def holds(self, name: str) -> int:
        """What the instance still holds, as LocalExecutor reads it: the larger of the gateway's own count
        (`gateway_holds`: sent and not finished; for prefill, until decode's pull of its KV was acknowledged or
        given up: trtpd/orchestration/orchestrator.py) and the instance's waiting + active. -1 (unknown, busy)
        when the gateway does not list it or cannot be reached."""
        return holds_of(self.health(), name)

    def samples(self, since_s: float) -> list:
        """Finished requests since `since_s` (unix time), for the rollout gate and the autoscaler; [] when the
        gateway cannot be reached."""
        from trtpd.schema.request_sample import RequestSample
        try:
            status, body = self._call("GET", f"/admin/requests?since={since_s}")
        except TrtpdError:
            return []
        return [RequestSample.from_dict(s) for s in body.get("requests", [])] if status == 200 else []


def holds_of(health: dict | None, name: str) -> int:
    for inst in (health or {}).get("instances", []):
        if inst.get("name") == name:
            return max(int(inst.get("gateway_holds", 0)), int(inst.get("waiting", 0)) + int(inst.get("active", 0)))
    return -1


class GatewayHolds:
    """KubernetesExecutor's holds_source: one GET /health serves every instance of one observe() (max_age_s)."""

    def __init__(self, gateway: GatewayAdmin, max_age_s: float = 0.2, clock=time.monotonic) -> None:
        self.gateway, self.max_age_s, self.clock = gateway, max_age_s, clock
        self._read_s, self._health = float("-inf"), None

    def __call__(self, name: str) -> int:
        if self.clock() - self._read_s > self.max_age_s:
            self._health, self._read_s = self.gateway.health(), self.clock()
        return holds_of(self._health, name)

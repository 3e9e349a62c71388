"""The controller's calls to the gateway (trtpd/gateway/app.py): drain or restore an instance, reload the fleet
file, read each instance's load from /health. Standard library HTTP; the token is the gateway's admin token,
derived from the deployment key as FleetService.admin_token derives it."""

from __future__ import annotations

import json
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

    def holds(self, name: str) -> int:
        """waiting + active for the instance in the gateway's /health; -1 when the gateway does not list it."""
        _, body = self._call("GET", "/health")
        for inst in body.get("instances", []):
            if inst.get("name") == name:
                return int(inst.get("waiting", 0)) + int(inst.get("active", 0))
        return -1

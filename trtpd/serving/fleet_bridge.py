"""The fleet's Triton entry: the `disagg_bls` stub of a fleet's entry server sends each of its clients' requests,
in token ids, to the fleet's gateway (POST /admin/generate, with the deployment's admin token), which serves
them as it serves OpenAI clients: the same admission, canary cohort, orchestrator, metrics and request samples,
so the controller's rollout gate and autoscaler see Triton clients too, and one admission bounds both. The
stub runs no orchestrator of its own. `serve` is the blocking face the BLS's per-request threads use (stdlib
http.client: no server framework in the stub)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path

from trtpd.schema.fleet_file import read_fleet_file

READ_TIMEOUT_S = 600.0     # the longest wait for the gateway's next line (a queued request waits for a slot)
KINDS = {400: "invalid_arg", 404: "invalid_arg", 413: "invalid_arg", 429: "unavailable", 503: "unavailable"}


class BridgeError(Exception):
    """The request failed at the gateway or on the way there; `kind` as the orchestrator's (Triton's code)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class BridgedRequest:
    """One request's stream from the gateway: iterate its steps ({"token_ids", "perf", ...}); `finish()` once the
    client has its last token (reads the gateway's end, so the request counts as served), or `close()` to cancel
    what is left (a stop word: the engine would go on)."""

    def __init__(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        self.conn, self.response = conn, response

    def __iter__(self) -> Iterator[dict]:
        for raw in self.response:
            line = json.loads(raw)
            if "error" in line:
                raise BridgeError(line["error"]["message"], line["error"].get("kind", "internal"))
            if line.get("done"):
                return
            yield line
        raise BridgeError("the fleet's gateway closed the stream before the request's end", "unavailable")

    def finish(self) -> None:
        try:
            for _ in self:
                pass
        except BridgeError:
            pass
        finally:
            self.close()

    def close(self) -> None:
        self.conn.close()      # a request still running is cancelled by the gateway when its client leaves


class FleetBridge:
    def __init__(self, fleet_file: str) -> None:
        from trtpd.kv.auth import gateway_admin_token
        from trtpd.kv.handle import load_or_create_key_file

        self.fleet_file = Path(fleet_file)
        self.admin_token = gateway_admin_token(load_or_create_key_file(read_fleet_file(self.fleet_file).key_file))
        self._address: tuple[str, int] | None = None   # read once it is there; again when it does not answer

    def gateway_address(self) -> tuple[str, int]:
        """The gateway's host and port, from fleet.json (the gateway is attached after the entry starts)."""
        try:
            gateway = read_fleet_file(self.fleet_file).gateway or {}
        except (OSError, ValueError):
            gateway = {}
        if not gateway.get("port"):
            raise BridgeError("the fleet's gateway is not running (the Triton entry serves its requests through it)",
                              "unavailable")
        return gateway.get("host", "127.0.0.1"), int(gateway["port"])

    def serve(self, request_id: str, prompt_ids: list[int], sampling) -> BridgedRequest:
        """Sends the request; returns its stream once the gateway answered with its first step. Refused or failed
        before it: BridgeError with the gateway's message (a full gateway: unavailable, its 429)."""
        host, port = self._address = self._address or self.gateway_address()
        body = {"request_id": request_id, "prompt_ids": prompt_ids, "max_new_tokens": sampling.max_new_tokens,
                "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
                "seed": sampling.seed, "end_id": sampling.end_id}
        conn = http.client.HTTPConnection(host, port, timeout=READ_TIMEOUT_S)
        try:
            conn.request("POST", "/admin/generate", body=json.dumps(body),
                         headers={"Authorization": f"Bearer {self.admin_token}", "Content-Type": "application/json"})
            response = conn.getresponse()
        except OSError as exc:
            conn.close()
            self._address = None          # a gateway that moved or is not back yet: fleet.json is read again
            raise BridgeError(f"the fleet's gateway at {host}:{port} cannot be reached: {exc}", "unavailable") from None
        if response.status != 200:
            try:
                message = json.loads(response.read())["error"]["message"]
            except (ValueError, KeyError, TypeError, OSError):
                message = f"HTTP {response.status}"
            conn.close()
            raise BridgeError(f"the fleet's gateway: {message}", KINDS.get(response.status, "internal"))
        return BridgedRequest(conn, response)

    def close(self) -> None:
        pass

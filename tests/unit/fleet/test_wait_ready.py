"""wait_ready: a tritonserver counts as ready once its HTTP endpoint says ready and its metrics endpoint
answers. tritonserver starts the metrics endpoint after HTTP, so a caller that read metrics at once (the
gateway's probe, a test waiting for streams) could find it refusing connections."""

from __future__ import annotations

import http.server
import os
import socket
import threading

import pytest

from trtpd.fleet.tritonserver import ServerError, ServerPorts, ServerProcess, wait_ready


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:   # noqa: N802
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def _serve(port: int = 0) -> http.server.ThreadingHTTPServer:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Ok)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ready_waits_for_the_metrics_endpoint(tmp_path):
    http_ep, metrics_port = _serve(), _unused_port()
    server = ServerProcess(pid=os.getpid(), ports=ServerPorts(http_ep.server_address[1], _unused_port(), metrics_port),
                           host="127.0.0.1", repo=str(tmp_path), log_path=str(tmp_path / "log"), shm_prefix="x")
    metrics_ep = None
    try:
        assert server.is_ready() and not server.metrics_ready()   # HTTP says ready; metrics refuse connections
        with pytest.raises(ServerError, match="not ready after"):
            wait_ready(server, timeout_s=0.5, poll_s=0.05)
        metrics_ep = _serve(metrics_port)
        wait_ready(server, timeout_s=5.0, poll_s=0.05)
        assert server.metrics_ready()
    finally:
        for ep in (http_ep, metrics_ep):
            if ep is not None:
                ep.shutdown()
                ep.server_close()

"""supervisord's event listener for a deployment with a controller: every death and restart of the gateway or the
controller (trtpd/fleet/supervisor.py runs them) is recorded in the deployment's audit log (controller.db), as
`gateway_died`, `gateway_restarted`, `controller_died`, `controller_restarted` (`from_state: STARTING`: it died
within a second of being started), and `*_gave_up` when one kept dying as it started."""

from __future__ import annotations

import json
import sys
import time

# BACKOFF: it died within startsecs of being started (still a death; supervisord retries with backoff)
AUDITED = {"PROCESS_STATE_EXITED": "died", "PROCESS_STATE_BACKOFF": "died", "PROCESS_STATE_RUNNING": "running",
           "PROCESS_STATE_FATAL": "gave_up"}


def audit_event(name: str, event: str, payload: dict[str, str]) -> dict | None:
    """The audit record for one supervisord event (None: not one to record). A clean exit (expected) is not a
    death; a program's first start is not a restart, its first start after a death is (even when the death came
    before it ever reached RUNNING)."""
    what = AUDITED.get(event)
    program = payload.get("processname", "")
    if what is None or program not in ("gateway", "controller"):
        return None
    if what == "died" and payload.get("expected") == "1":
        return None
    key = f"{name}/{program}"
    if what == "died":
        _died.add(key)
    elif what == "running":   # a restart only after a death: not the first start, not a listener that restarted
        if key not in _died:
            return None
        _died.discard(key)
    action = {"died": f"{program}_died", "running": f"{program}_restarted", "gave_up": f"{program}_gave_up"}[what]
    return {"action": action, "detail": {"pid": int(payload["pid"]) if payload.get("pid", "").isdigit() else None,
                                          "from_state": payload.get("from_state")}}


_died: set[str] = set()   # programs that died and are not yet running again


def listen(name: str, stdin=sys.stdin, stdout=sys.stdout) -> None:
    """supervisord's event listener protocol (supervisor.childutils), forever."""
    from supervisor import childutils

    while True:
        headers, body = childutils.listener.wait(stdin, stdout)
        try:
            payload = dict(part.split(":", 1) for part in body.split() if ":" in part)
            record = audit_event(name, headers.get("eventname", ""), payload)
            if record is not None:
                _write_audit(name, record)
        except Exception as exc:   # noqa: BLE001 - a listener that dies stalls supervisord's event queue
            print(f"trtpd audit listener: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        childutils.listener.ok(stdout)


def _write_audit(name: str, record: dict) -> None:
    from trtpd.controller.store import ControllerStore
    from trtpd.fleet import deployment

    if not (deployment.deployment_dir(name) / "controller.db").is_file():
        print(json.dumps({"ts": time.time(), **record}), file=sys.stderr, flush=True)
        return
    store = ControllerStore.for_deployment(name)
    store.audit("supervisord", record["action"], int(store.get("stable_revision", 0) or 0), record["detail"])


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m trtpd.controller.supervisor_events",
                                description="supervisord event listener: deaths and restarts into the audit log")
    p.add_argument("--name", required=True, help="the deployment")
    listen(p.parse_args(argv).name)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The CLI's side of the controller: submit a command through the store, wait for it, follow the audit log."""

from __future__ import annotations

import time

from trtpd.controller.store import ControllerStore, actor
from trtpd.errors import TrtpdError
from trtpd.fleet import deployment


def open_store(name: str) -> ControllerStore:
    path = deployment.deployment_dir(name) / "controller.db"
    if not path.is_file():
        raise TrtpdError(f"no controller state for {name!r} ({path} does not exist); start the deployment with "
                         f"`trtpd up -f configs/deployments/<spec>.yaml`")
    return ControllerStore.for_deployment(name)


def require_controller(store: ControllerStore, name: str) -> None:
    from trtpd.controller.daemon import controller_alive
    if controller_alive(store) is None:
        raise TrtpdError(f"deployment {name!r} has no controller running; start it with `trtpd up -f <spec>` "
                         f"(see `trtpd history {name}`)")


def submit_and_wait(name: str, kind: str, payload: dict, timeout_s: float = 30.0) -> dict:
    store = open_store(name)
    require_controller(store, name)
    command_id = store.submit(kind, payload, actor())
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        command = store.command(command_id)
        if command.status == "done":
            return command.result
        if command.status == "failed":
            raise TrtpdError(f"{kind} refused: {command.result.get('error')}")
        time.sleep(0.1)
    raise TrtpdError(f"the controller did not take the {kind} command within {timeout_s:.0f} s")


def format_event(row) -> str:
    detail = {k: v for k, v in row.detail.items() if v not in (None, "", False, [], {})}
    when = time.strftime("%H:%M:%S", time.localtime(row.ts)) + f".{int(row.ts * 10) % 10}"
    text = ", ".join(f"{k}={v}" for k, v in detail.items() if k not in ("gate", "changes"))
    gate = row.detail.get("gate")
    if gate:
        c, s = gate["canary"], gate["stable"]
        text += (f"; gate: canary {c['requests']} req, TTFT p {_ms(c['ttft_p_s'])}, TPOT p {_ms(c.get('tpot_p_s'))}, "
                 f"errors {c['errors']} | stable {s['requests']} req, TTFT p {_ms(s['ttft_p_s'])}, "
                 f"TPOT p {_ms(s.get('tpot_p_s'))}, errors {s['errors']}")   # (.get: a gate recorded before TPOT)
    return f"{when}  r{row.revision:<3} {row.actor:<12} {row.action:<18} {text}"


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1000:.1f} ms"


def follow(store: ControllerStore, since_id: int, until, timeout_s: float, out=print) -> int:
    """Prints audit entries after `since_id` until `until()` is true; returns the last id seen."""
    deadline = time.monotonic() + timeout_s
    last = since_id
    while True:
        for row in store.audit_log(since_id=last):
            out(format_event(row))
            last = row.id
        if until():
            return last
        if time.monotonic() > deadline:
            raise TrtpdError(f"still not done after {timeout_s:.0f} s (the controller goes on; "
                             f"`trtpd history` shows where it is)")
        time.sleep(0.2)


def last_audit_id(store: ControllerStore) -> int:
    log = store.audit_log()
    return log[-1].id if log else 0


def wait_converged(name: str, timeout_s: float, since_id: int | None = None, out=print) -> None:
    from trtpd.controller.controller import converged
    store = open_store(name)
    start = since_id if since_id is not None else last_audit_id(store)
    follow(store, start, lambda: converged(store), timeout_s, out)

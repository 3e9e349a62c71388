"""What `trtpd rollout` does on the user's side: lint, diff, record the revision, hand it to the controller,
follow it to the end. The controller process does the rollout itself (trtpd/controller/controller.py)."""

from __future__ import annotations

from pathlib import Path

from trtpd.cli.controller_client import follow, last_audit_id, open_store, require_controller, submit_and_wait
from trtpd.controller.rollout import TERMINAL
from trtpd.controller.spec import DeploymentSpec, check_revision, diff_specs, load_spec
from trtpd.controller.store import actor
from trtpd.errors import TrtpdError


def previous_revision(store) -> int:
    """The revision that was stable before the current one (the latest superseded)."""
    stable = int(store.get("stable_revision", 0))
    earlier = [r.number for r in store.revisions() if r.status == "superseded" and r.number != stable]
    if not earlier:
        raise TrtpdError("no earlier revision to go back to (see `trtpd history`)")
    return max(earlier)


def rollout(spec_path: str | None, *, undo: str | None = None, dry_run: bool = False, wait: bool = True,
            timeout_s: float = 900.0, out=print) -> int:
    if undo:
        store = open_store(undo)
        target = previous_revision(store)
        new = DeploymentSpec.from_json(store.revision(target).spec_json)
        source, note = f"revision {target}", f"undo: back to revision {target}"
    else:
        new = load_spec(Path(spec_path))
        store = open_store(new.name)
        source, note = str(spec_path), ""
    name = new.name
    stable = int(store.get("stable_revision", 0))
    old = DeploymentSpec.from_json(store.revision(stable).spec_json)
    number = max((r.number for r in store.revisions()), default=0) + 1
    changes = diff_specs(old, new)
    out(f"{name}: revision {stable} -> {number} ({source})")
    for c in changes:
        out(f"  {c.field}: {c.old!r} -> {c.new!r}   [{c.effect}]")
    if not changes:
        out("  no change: nothing to roll out")
        return 0
    problems = check_revision(new, old, revision=number)
    if problems:
        out("refused (nothing was started):")
        for p in problems:
            out(f"  {p}")
        if not dry_run:
            n = store.add_revision(new.to_yaml(), new.spec_json(), source, actor(), "refused by lint")
            store.set_revision_status(n, "refused")
            store.audit(actor(), "rollout_refused", n, {"problems": problems, "source": source})
        return 2
    if dry_run:
        out("lint: no problems (dry run: nothing applied)")
        return 0
    require_controller(store, name)
    last = last_audit_id(store)
    number = store.add_revision(new.to_yaml(), new.spec_json(), source, actor(), note)
    store.set_revision_status(number, "pending")
    result = submit_and_wait(name, "rollout", {"revision": number})
    if result.get("in_place"):
        out(f"applied in place (no instance restarted): revision {number} is now stable")
        follow(store, last, lambda: True, 5, out)
        return 0
    out(f"rollout of revision {number} started: changed roles {', '.join(result['changed_roles'])}")
    if not wait:
        return 0

    def finished() -> bool:
        r = store.get("rollout")
        return r is not None and r["revision"] == number and r["phase"] in TERMINAL

    follow(store, last, finished, timeout_s, out)
    phase = store.get("rollout")["phase"]
    out(f"revision {number}: {'promoted' if phase == 'done' else 'rolled back'}")
    return 0 if phase == "done" else 1

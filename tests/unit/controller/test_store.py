import multiprocessing
import os
import sqlite3
import stat

import pytest

from trtpd.controller.store import ControllerStore, actor
from trtpd.controller.types import InstanceRow
from trtpd.errors import TrtpdError


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def store(tmp_path) -> ControllerStore:
    return ControllerStore(tmp_path / "dep" / "controller.db")


def test_file_0600_in_a_0700_folder_under_a_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        s = ControllerStore(tmp_path / "a" / "controller.db")
        s.put("k", 1)
    finally:
        os.umask(old)
    assert mode(tmp_path / "a") == 0o700
    assert mode(s.path) == 0o600
    with sqlite3.connect(s.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA user_version").fetchone()[0] == 1


def test_for_deployment_lives_under_trtpd_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTPD_HOME", str(tmp_path / "home"))
    s = ControllerStore.for_deployment("tiny")
    assert s.path == (tmp_path / "home" / "deployments" / "tiny" / "controller.db").resolve()
    assert mode(s.path.parent) == 0o700 and mode(s.path) == 0o600


def test_revisions_round_trip_and_number_from_one(store):
    first = store.add_revision("name: a\n", {"name": "a"}, "configs/a.yaml", "alice", note="first")
    second = store.add_revision("name: b\n", {"name": "b", "roles": {"decode": {"instances": 2}}}, "b.yaml", "bob")
    assert (first, second) == (1, 2)
    row = store.revision(2)
    assert (row.number, row.author, row.source, row.spec_yaml, row.status, row.note) == \
        (2, "bob", "b.yaml", "name: b\n", "pending", "")
    assert row.spec_json == {"name": "b", "roles": {"decode": {"instances": 2}}}
    store.set_revision_status(1, "promoted")
    assert [(r.number, r.status, r.note) for r in store.revisions()] == [(1, "promoted", "first"), (2, "pending", "")]


def test_missing_rows_and_bad_statuses_name_what_is_wrong(store):
    with pytest.raises(TrtpdError, match=r"no revision 3; known: none yet"):
        store.revision(3)
    store.add_revision("", {}, "x.yaml", "a")
    store.add_revision("", {}, "x.yaml", "a")
    with pytest.raises(TrtpdError, match=r"no revision 7; known: 1, 2$"):
        store.set_revision_status(7, "applied")
    with pytest.raises(TrtpdError, match=r"revision status 'done': use one of pending, applied"):
        store.set_revision_status(1, "done")
    with pytest.raises(TrtpdError, match=r"no command 4 \(no command submitted yet\)"):
        store.command(4)
    store.submit("apply", {}, "a")
    with pytest.raises(TrtpdError, match=r"no command 4 \(commands are numbered 1 to 1\)"):
        store.finish(4, "done", {})
    with pytest.raises(TrtpdError, match=r"instance x: state 'up'"):
        store.put_instance(InstanceRow("x", "decode", 1, "up", 0.0))


def test_instances_upsert_filter_and_remove(store):
    a = InstanceRow("decode-r1-0", "decode", 1, "starting", 10.0, detail={"pid": 42, "ports": [1, 2]})
    b = InstanceRow("prefill-r1-0", "prefill", 1, "ready", 11.0)
    store.put_instance(a)
    store.put_instance(b)
    assert store.instance("decode-r1-0") == a
    ready = InstanceRow("decode-r1-0", "decode", 1, "ready", 12.0, "health ok", {"pid": 42})
    store.put_instance(ready)
    assert store.instances() == [ready, b]
    assert store.instances(("starting",)) == []
    assert store.instances(("ready", "draining")) == [ready, b]
    store.remove_instance("prefill-r1-0")
    assert store.instance("prefill-r1-0") is None and store.instances() == [ready]


def test_audit_log_and_state(store):
    ids = [store.audit("alice", "apply", 1, {"n": 1}), store.audit("ctl", "start", 1, {"instance": "decode-r1-0"}),
           store.audit("ctl", "promote", 2, {})]
    assert ids == [1, 2, 3]
    assert [(r.id, r.action, r.revision, r.detail) for r in store.audit_log(since_id=1)] == \
        [(2, "start", 1, {"instance": "decode-r1-0"}), (3, "promote", 2, {})]
    assert [r.id for r in store.audit_log(limit=2)] == [1, 2]
    assert store.get("stable_revision") is None and store.get("stable_revision", 0) == 0
    store.put("stable_revision", 3)
    store.put_many({"canary": {"revision": 4, "share": 0.25}, "stable_revision": 4})
    assert (store.get("stable_revision"), store.get("canary")) == (4, {"revision": 4, "share": 0.25})
    with pytest.raises(TypeError):
        store.put_many({"a": 1, "b": object()})      # nothing is written
    assert store.get("a") is None


def test_commands_claimed_once(store):
    first = store.submit("apply", {"revision": 2}, "alice")
    second = store.submit("rollback", {}, "bob")
    assert [(c.id, c.kind, c.payload, c.status) for c in store.pending()] == \
        [(first, "apply", {"revision": 2}, "pending"), (second, "rollback", {}, "pending")]
    assert store.claim(first) is True and store.claim(first) is False
    assert [c.id for c in store.pending()] == [second]
    store.finish(first, "done", {"applied": 2})
    row = store.command(first)
    assert (row.status, row.result, row.actor) == ("done", {"applied": 2}, "alice")
    assert store.claim(first) is False


def _worker(path: str, worker: int, num_commands: int, queue) -> None:
    store = ControllerStore(path)
    for n in range(num_commands):
        store.submit("scale", {"worker": worker, "n": n}, actor())
    claimed = []
    for _ in range(200):
        for command in store.pending():
            if store.claim(command.id):
                claimed.append(command.id)
        if len(store.pending()) == 0:
            break
    queue.put(claimed)


def test_two_processes_submit_and_claim_each_command_exactly_once(tmp_path):
    path = str(tmp_path / "dep" / "controller.db")      # both create it at once
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    workers = [context.Process(target=_worker, args=(path, w, 40, queue)) for w in range(2)]
    for p in workers:
        p.start()
    claimed = [queue.get(timeout=30) for _ in workers]
    for p in workers:
        p.join(timeout=60)
        assert p.exitcode == 0
    everything = claimed[0] + claimed[1]
    assert sorted(everything) == list(range(1, 81))        # each one claimed, none twice
    store = ControllerStore(path)
    assert store.pending() == []
    assert {(c.payload["worker"], c.payload["n"]) for c in map(store.command, range(1, 81))} == \
        {(w, n) for w in range(2) for n in range(40)}


def test_a_reopened_store_resumes(tmp_path):
    path = tmp_path / "dep" / "controller.db"
    s = ControllerStore(path)
    s.add_revision("name: t\n", {"name": "t"}, "t.yaml", "alice")
    s.set_revision_status(1, "applied")
    s.put_instance(InstanceRow("decode-r1-0", "decode", 1, "ready", 5.0, detail={"pid": 7}))
    s.put("stable_revision", 1)
    s.submit("apply", {}, "alice")
    again = ControllerStore(path)
    assert [(r.number, r.status) for r in again.revisions()] == [(1, "applied")]
    assert again.instance("decode-r1-0").detail == {"pid": 7}
    assert again.get("stable_revision") == 1
    assert [c.kind for c in again.pending()] == ["apply"]
    assert again.add_revision("", {}, "u.yaml", "bob") == 2


def test_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "controller.db"
    ControllerStore(path)
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version=99")
    with pytest.raises(TrtpdError, match=r"schema version 99 is newer than this trtpd's \(1\); upgrade trtpd"):
        ControllerStore(path)


def test_actor_names_user_host_and_pid():
    who = actor()
    assert who.endswith(f" (pid {os.getpid()})") and "@" in who

"""The controller's SQLite database: revisions of the spec, the instance table, the audit log, small state and
the command queue that CLI commands hand to the controller daemon.

One file per deployment ($TRTPD_HOME/deployments/<name>/controller.db), 0600 in a 0700 folder, WAL journal.
The daemon and CLI commands open it at once: every call takes its own short connection (nothing is shared
across threads or processes) and every write is one `BEGIN IMMEDIATE` transaction, waiting up to 10 s for a
writer ahead of it.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from trtpd.controller.types import LIFECYCLE, InstanceRow
from trtpd.errors import TrtpdError

SCHEMA_VERSION = 1
REVISION_STATUSES = ("pending", "applied", "canary", "promoted", "rolled_back", "refused", "superseded")
COMMAND_STATUSES = ("pending", "running", "done", "failed")
BUSY_TIMEOUT_S = 10.0

_SCHEMA = """
CREATE TABLE revisions (number INTEGER PRIMARY KEY, created_at REAL NOT NULL, author TEXT NOT NULL,
    source TEXT NOT NULL, spec_yaml TEXT NOT NULL, spec_json TEXT NOT NULL, status TEXT NOT NULL, note TEXT NOT NULL);
CREATE TABLE instances (name TEXT PRIMARY KEY, role TEXT NOT NULL, revision INTEGER NOT NULL, state TEXT NOT NULL,
    since_s REAL NOT NULL, reason TEXT NOT NULL, detail_json TEXT NOT NULL);
CREATE TABLE audit (id INTEGER PRIMARY KEY, ts REAL NOT NULL, actor TEXT NOT NULL, action TEXT NOT NULL,
    revision INTEGER NOT NULL, detail_json TEXT NOT NULL);
CREATE TABLE state (key TEXT PRIMARY KEY, value_json TEXT NOT NULL);
CREATE TABLE commands (id INTEGER PRIMARY KEY, ts REAL NOT NULL, actor TEXT NOT NULL, kind TEXT NOT NULL,
    payload_json TEXT NOT NULL, status TEXT NOT NULL, result_json TEXT NOT NULL);
"""


@dataclass(frozen=True)
class RevisionRow:
    number: int
    created_at: float
    author: str
    source: str          # the spec file it was applied from
    spec_yaml: str
    spec_json: dict
    status: str          # one of REVISION_STATUSES
    note: str = ""


@dataclass(frozen=True)
class AuditRow:
    id: int
    ts: float
    actor: str
    action: str
    revision: int
    detail: dict


@dataclass(frozen=True)
class CommandRow:
    id: int
    ts: float
    actor: str
    kind: str
    payload: dict
    status: str          # one of COMMAND_STATUSES
    result: dict


def actor() -> str:
    """Who is acting, for the audit log: "user@host (pid N)"."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):      # no passwd entry (containers)
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()} (pid {os.getpid()})"


class ControllerStore:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        _create_private(self.path)
        with self._connect() as db:
            _use_wal(db, self.path)
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise TrtpdError(f"{self.path}: schema version {version} is newer than this trtpd's "
                                 f"({SCHEMA_VERSION}); upgrade trtpd")
            if version == 0:
                with self._write(db):
                    if db.execute("PRAGMA user_version").fetchone()[0] == 0:   # not created meanwhile
                        for statement in filter(str.strip, _SCHEMA.split(";")):
                            db.execute(statement)
                        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    @classmethod
    def for_deployment(cls, name: str) -> "ControllerStore":
        """$TRTPD_HOME/deployments/<name>/controller.db; the deployment's folder is made 0700 (it also holds
        the KV signing key)."""
        from trtpd.fleet.deployment import deployment_dir

        folder = deployment_dir(name)
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        return cls(folder / "controller.db")

    # -- connections ------------------------------------------------------------------------------
    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            yield db
        finally:
            db.close()

    @contextmanager
    def _write(self, db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._connect() as db, self._write(db):
            yield db

    def _rows(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._connect() as db:
            return db.execute(sql, args).fetchall()

    # -- revisions --------------------------------------------------------------------------------
    def add_revision(self, spec_yaml: str, spec_json: dict, source: str, author: str, note: str = "") -> int:
        with self._transaction() as db:
            cursor = db.execute("INSERT INTO revisions (created_at, author, source, spec_yaml, spec_json, status, note) "
                                "VALUES (?, ?, ?, ?, ?, 'pending', ?)",
                                (time.time(), author, str(source), spec_yaml, json.dumps(spec_json), note))
            return cursor.lastrowid

    def revision(self, number: int) -> RevisionRow:
        rows = self._rows("SELECT * FROM revisions WHERE number = ?", (number,))
        if not rows:
            known = [n for (n,) in self._rows("SELECT number FROM revisions ORDER BY number")]
            raise TrtpdError(f"{self.path}: no revision {number}; known: "
                             f"{', '.join(map(str, known)) or 'none yet (trtpd apply adds the first)'}")
        return _revision(rows[0])

    def revisions(self) -> list[RevisionRow]:
        return [_revision(row) for row in self._rows("SELECT * FROM revisions ORDER BY number")]

    def set_revision_status(self, number: int, status: str) -> None:
        if status not in REVISION_STATUSES:
            raise TrtpdError(f"revision status {status!r}: use one of {', '.join(REVISION_STATUSES)}")
        with self._transaction() as db:
            updated = db.execute("UPDATE revisions SET status = ? WHERE number = ?", (status, number)).rowcount
        if not updated:
            self.revision(number)     # raises, naming the known revisions

    # -- instances --------------------------------------------------------------------------------
    def put_instance(self, row: InstanceRow) -> None:
        if row.state not in LIFECYCLE:
            raise TrtpdError(f"instance {row.name}: state {row.state!r}; use one of {', '.join(LIFECYCLE)}")
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO instances VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (row.name, row.role, row.revision, row.state, row.since_s, row.reason, json.dumps(row.detail)))

    def instance(self, name: str) -> InstanceRow | None:
        rows = self._rows("SELECT * FROM instances WHERE name = ?", (name,))
        return _instance(rows[0]) if rows else None

    def instances(self, states: tuple[str, ...] | None = None) -> list[InstanceRow]:
        rows = self._rows("SELECT * FROM instances ORDER BY name")
        return [_instance(row) for row in rows if states is None or row[3] in states]

    def remove_instance(self, name: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM instances WHERE name = ?", (name,))

    # -- audit ------------------------------------------------------------------------------------
    def audit(self, actor: str, action: str, revision: int, detail: dict) -> int:
        with self._transaction() as db:
            return db.execute("INSERT INTO audit (ts, actor, action, revision, detail_json) VALUES (?, ?, ?, ?, ?)",
                              (time.time(), actor, action, revision, json.dumps(detail))).lastrowid

    def audit_log(self, since_id: int = 0, limit: int | None = None) -> list[AuditRow]:
        rows = self._rows("SELECT * FROM audit WHERE id > ? ORDER BY id LIMIT ?",
                          (since_id, -1 if limit is None else limit))
        return [AuditRow(i, ts, who, action, rev, json.loads(detail)) for i, ts, who, action, rev, detail in rows]

    # -- state ------------------------------------------------------------------------------------
    def get(self, key: str, default: object = None) -> object:
        rows = self._rows("SELECT value_json FROM state WHERE key = ?", (key,))
        return json.loads(rows[0][0]) if rows else default

    def put(self, key: str, value: object) -> None:
        self.put_many({key: value})

    def put_many(self, values: dict[str, object]) -> None:
        encoded = [(key, json.dumps(value)) for key, value in values.items()]   # fails before writing anything
        with self._transaction() as db:
            db.executemany("INSERT OR REPLACE INTO state VALUES (?, ?)", encoded)

    # -- commands ---------------------------------------------------------------------------------
    def submit(self, kind: str, payload: dict, actor: str) -> int:
        with self._transaction() as db:
            return db.execute("INSERT INTO commands (ts, actor, kind, payload_json, status, result_json) "
                              "VALUES (?, ?, ?, ?, 'pending', '{}')",
                              (time.time(), actor, kind, json.dumps(payload))).lastrowid

    def pending(self) -> list[CommandRow]:
        return [_command(row) for row in self._rows("SELECT * FROM commands WHERE status = 'pending' ORDER BY id")]

    def claim(self, command_id: int) -> bool:
        """pending -> running; False when it is not pending (someone else claimed it, or it is finished)."""
        with self._transaction() as db:
            return db.execute("UPDATE commands SET status = 'running' WHERE id = ? AND status = 'pending'",
                              (command_id,)).rowcount == 1

    def finish(self, command_id: int, status: str, result: dict) -> None:
        if status not in ("done", "failed"):
            raise TrtpdError(f"command {command_id}: finish with status done or failed, not {status!r}")
        with self._transaction() as db:
            updated = db.execute("UPDATE commands SET status = ?, result_json = ? WHERE id = ?",
                                 (status, json.dumps(result), command_id)).rowcount
        if not updated:
            self.command(command_id)  # raises

    def command(self, command_id: int) -> CommandRow:
        rows = self._rows("SELECT * FROM commands WHERE id = ?", (command_id,))
        if not rows:
            last = self._rows("SELECT MAX(id) FROM commands")[0][0]
            raise TrtpdError(f"{self.path}: no command {command_id} "
                             f"({f'commands are numbered 1 to {last}' if last else 'no command submitted yet'})")
        return _command(rows[0])


def _use_wal(db: sqlite3.Connection, path: Path) -> None:
    """Switches a new file to WAL. The switch needs the file to itself and sqlite answers "locked" at once
    (without its busy timeout) while another process is opening it too, so this retries for BUSY_TIMEOUT_S."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            if db.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal":
                return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
        if time.monotonic() > deadline:
            raise TrtpdError(f"{path}: cannot switch the database to WAL (another process holds it for more than "
                             f"{BUSY_TIMEOUT_S:.0f} s); stop it or retry")
        time.sleep(0.05)


def _create_private(path: Path) -> None:
    """The folder 0700 when this creates it, the file 0600, whatever the umask, before sqlite opens it."""
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def _revision(row: tuple) -> RevisionRow:
    number, created_at, author, source, spec_yaml, spec_json, status, note = row
    return RevisionRow(number, created_at, author, source, spec_yaml, json.loads(spec_json), status, note)


def _instance(row: tuple) -> InstanceRow:
    name, role, revision, state, since_s, reason, detail = row
    return InstanceRow(name, role, revision, state, since_s, reason, json.loads(detail))


def _command(row: tuple) -> CommandRow:
    command_id, ts, who, kind, payload, status, result = row
    return CommandRow(command_id, ts, who, kind, json.loads(payload), status, json.loads(result))

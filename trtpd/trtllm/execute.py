"""Run a build plan: each step with a log, a manifest per engine, and skips for what is up to date.

Every side effect goes through a `Runner` (the real one starts subprocesses; tests pass a fake).
An engine folder's manifest moves planned -> building -> complete | failed. A failed step removes
what it half-wrote (checkpoint or engine files) but keeps the manifest with the error and the log.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from trtpd.schema.manifest import (MANIFEST_NAME, EngineManifest, FileChecksum, load_manifest, now_iso,
                                   write_manifest)
from trtpd.trtllm.plan import BuildPlan, RolePlan, Step
from trtpd.errors import ConfigError, TrtpdError

STAMP_NAME = "trtpd-step.json"
Report = Callable[[str], None]


class BuildStepError(TrtpdError):
    """A quantize/convert/trtllm-build command exited non-zero."""


class Runner(Protocol):
    def run(self, argv: list[str], env: dict[str, str], log_path: Path, on_line: Report) -> int: ...


class SubprocessRunner:
    """Runs a command, appending its output to `log_path` and passing each line to `on_line`."""

    def run(self, argv: list[str], env: dict[str, str], log_path: Path, on_line: Report) -> int:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a") as log:
            log.write(f"$ {' '.join(argv)}\n")
            try:
                proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, bufsize=1)
            except OSError as exc:
                log.write(f"cannot start: {exc}\n")
                on_line(f"cannot start {argv[0]}: {exc}")
                return 127
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                on_line(line.rstrip())
            return proc.wait()


def checksums(folder: Path) -> list[FileChecksum]:
    sums = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in (MANIFEST_NAME, STAMP_NAME)):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        sums.append(FileChecksum(path=str(path.relative_to(folder)), sha256=digest.hexdigest(),
                                 size_bytes=path.stat().st_size))
    return sums


def engine_is_current(engine_dir: Path, expected: EngineManifest) -> bool:
    """True when `engine_dir` holds a complete manifest for exactly `expected`, and its files match."""
    try:
        existing = load_manifest(engine_dir)
    except ConfigError:
        return False
    return (existing.status == "complete" and existing.inputs_digest() == expected.inputs_digest()
            and existing.checksums == checksums(engine_dir))


def checkpoint_is_current(step: Step) -> bool:
    stamp = step.output_dir / STAMP_NAME
    if not stamp.is_file():
        return False
    try:
        data = json.loads(stamp.read_text())
    except json.JSONDecodeError:
        return False
    return data.get("argv") == step.argv and data.get("status") == "ok"


def _clear(folder: Path, keep: tuple[str, ...] = ()) -> None:
    if not folder.exists():
        return
    for child in folder.iterdir():
        if child.name in keep:
            continue
        shutil.rmtree(child) if child.is_dir() else child.unlink()


def run_step(step: Step, runner: Runner, log_path: Path, report: Report) -> float:
    report(f"running {step.name}: {step.shell()}")
    report(f"  log: {log_path}")
    started = time.monotonic()
    code = runner.run(step.argv, dict(step.env), log_path, lambda line: report(f"  [{step.name}] {line}"))
    duration_s = time.monotonic() - started
    if code != 0:
        raise BuildStepError(f"{step.name} failed with exit code {code} after {duration_s:.0f} s; "
                             f"see {log_path} (the command is recorded there and in the manifest)")
    report(f"  {step.name} finished in {duration_s:.1f} s")
    return duration_s


def execute_plan(plan: BuildPlan, runner: Runner, report: Report, *, versions: dict[str, str],
                 force: bool = False) -> list[EngineManifest]:
    logs = plan.request.model_dir / "logs"
    done_checkpoints: dict[Path, float | None] = {}
    manifests = []
    for role in plan.roles:
        expected = role.manifest.model_copy(update={"versions": {**role.manifest.versions, **versions}})
        if not force and engine_is_current(role.engine_dir, expected):
            report(f"{role.engine_dir.name}: up to date (manifest matches), skipped")
            manifests.append(load_manifest(role.engine_dir))
            continue
        manifests.append(_build_role(role, expected, runner, report, logs, force, done_checkpoints))
    return manifests


def _build_role(role: RolePlan, expected: EngineManifest, runner: Runner, report: Report, logs: Path,
                force: bool, done_checkpoints: dict[Path, float | None]) -> EngineManifest:
    ckpt, build = role.checkpoint_step, role.build_step
    manifest = expected.model_copy(update={"status": "building", "updated_at": now_iso()})
    _clear(role.engine_dir)
    write_manifest(manifest, role.engine_dir)
    records = list(manifest.steps)
    try:
        if ckpt.output_dir in done_checkpoints:
            records[0] = records[0].model_copy(update={"status": "skipped"})
        elif not force and checkpoint_is_current(ckpt):
            report(f"{ckpt.output_dir.name}: checkpoint up to date, skipped")
            done_checkpoints[ckpt.output_dir] = None
            records[0] = records[0].model_copy(update={"status": "skipped"})
        else:
            records[0] = _run_checkpoint(ckpt, runner, report, logs, done_checkpoints)
        log_path = logs / f"trtllm-build-{role.engine_dir.name}.log"
        records[1] = records[1].model_copy(update={"log_path": str(log_path)})
        duration_s = run_step(build, runner, log_path, report)
        records[1] = records[1].model_copy(update={"status": "ok", "duration_s": round(duration_s, 3)})
    except BuildStepError as exc:
        records = [r if r.status != "planned" else r.model_copy(update={"status": "failed"}) for r in records]
        _clear(role.engine_dir, keep=(MANIFEST_NAME,))
        write_manifest(manifest.model_copy(update={"status": "failed", "error": str(exc), "steps": records,
                                                   "updated_at": now_iso()}), role.engine_dir)
        raise
    final = manifest.model_copy(update={"status": "complete", "steps": records, "updated_at": now_iso(),
                                        "checksums": checksums(role.engine_dir)})
    write_manifest(final, role.engine_dir)
    report(f"{role.engine_dir.name}: complete ({len(final.checksums)} files, manifest written)")
    return final


def _run_checkpoint(step: Step, runner: Runner, report: Report, logs: Path, done: dict[Path, float | None]):
    log_path = logs / f"{step.name}-{step.output_dir.name}.log"
    record = step.record().model_copy(update={"log_path": str(log_path)})
    _clear(step.output_dir)
    try:
        duration_s = run_step(step, runner, log_path, report)
    except BuildStepError:
        _clear(step.output_dir)
        raise
    step.output_dir.mkdir(parents=True, exist_ok=True)
    (step.output_dir / STAMP_NAME).write_text(json.dumps({"argv": step.argv, "status": "ok",
                                                          "finished_at": now_iso()}, indent=2) + "\n")
    done[step.output_dir] = duration_s
    return record.model_copy(update={"status": "ok", "duration_s": round(duration_s, 3)})

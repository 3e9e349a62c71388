"""Run a build plan: each step with a log, a manifest per engine, and skips for what is up to date.

Every side effect goes through a `Runner` (the real one starts subprocesses; tests pass a fake).
An engine folder's manifest moves planned -> building -> complete | failed. A failed step removes
what it half-wrote (checkpoint or engine files) but keeps the manifest with the error and the log.
With FP8, both checkpoints are made before any engine, and their KV scales are read back and compared
(kv_scales.py): a prefill/decode pair quantized in two calibrations that disagree is refused, and each
engine's manifest records its digest (`kv_scales_digest`) for `trtpd lint`.
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

from trtpd.errors import ConfigError, TrtpdError
from trtpd.schema.manifest import (MANIFEST_NAME, EngineManifest, FileChecksum, StepRecord, load_manifest, now_iso,
                                   write_manifest)
from trtpd.trtllm.kv_scales import KvScales, KvScalesError, read_kv_scales, require_same_scales
from trtpd.trtllm.plan import BuildPlan, RolePlan, Step

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
    """Checkpoints first, then (FP8) the pair's KV scales compared, then the engines: a pair whose two
    calibrations disagree is refused before any engine is built."""
    logs = plan.request.model_dir / "logs"
    expected = {role.spec.role: role.manifest.model_copy(update={"versions": {**role.manifest.versions, **versions}})
                for role in plan.roles}
    todo = []
    for role in plan.roles:
        if not force and engine_is_current(role.engine_dir, expected[role.spec.role]):
            report(f"{role.engine_dir.name}: up to date (manifest matches), skipped")
        else:
            todo.append(role)
    building = {role.spec.role: _start_role(role, expected[role.spec.role]) for role in todo}
    try:
        checkpoint_records = _run_checkpoints(todo, runner, report, logs, force)
        digests = _kv_scales_digests(plan, todo)
    except TrtpdError as exc:
        for role in todo:
            _fail_role(role, building[role.spec.role], str(exc), checkpoint_records=None)
        raise
    for role in todo:
        manifest = building[role.spec.role].model_copy(update={"kv_scales_digest": digests.get(role.spec.role)})
        _build_role(role, manifest, checkpoint_records[role.spec.role], runner, report, logs)
    return [load_manifest(role.engine_dir) for role in plan.roles]


def _start_role(role: RolePlan, expected: EngineManifest) -> EngineManifest:
    manifest = expected.model_copy(update={"status": "building", "updated_at": now_iso()})
    _clear(role.engine_dir)
    write_manifest(manifest, role.engine_dir)
    return manifest


def _fail_role(role: RolePlan, manifest: EngineManifest, error: str, checkpoint_records) -> None:
    records = list(manifest.steps)
    if checkpoint_records is not None:
        records[0] = checkpoint_records
    records = [r if r.status != "planned" else r.model_copy(update={"status": "failed"}) for r in records]
    _clear(role.engine_dir, keep=(MANIFEST_NAME,))
    write_manifest(manifest.model_copy(update={"status": "failed", "error": error, "steps": records,
                                               "updated_at": now_iso()}), role.engine_dir)


def _run_checkpoints(todo: list[RolePlan], runner: Runner, report: Report, logs: Path,
                     force: bool) -> dict[str, StepRecord]:
    """Each distinct checkpoint once, in plan order; {role: its checkpoint step's record}."""
    records: dict[str, StepRecord] = {}
    done: set[Path] = set()
    for role in todo:
        step = role.checkpoint_step
        if step.output_dir in done:
            records[role.spec.role] = step.record().model_copy(update={"status": "skipped"})
        elif not force and checkpoint_is_current(step):
            report(f"{step.output_dir.name}: checkpoint up to date, skipped")
            records[role.spec.role] = step.record().model_copy(update={"status": "skipped"})
        else:
            records[role.spec.role] = _run_checkpoint(step, runner, report, logs)
        done.add(step.output_dir)
    return records


def _kv_scales_digests(plan: BuildPlan, todo: list[RolePlan]) -> dict[str, str]:
    """FP8: each role's KV-scale digest read back from its checkpoint; raises KvScalesError when they differ.
    A role that is up to date keeps the digest its manifest has when its checkpoint is gone."""
    if not plan.request.fp8:
        return {}
    scales: dict[str, KvScales] = {}
    digests: dict[str, str] = {}
    for role in plan.roles:
        s = role.spec
        if role in todo or any(role.checkpoint_step.output_dir.glob("rank*.safetensors")):
            scales[s.role] = read_kv_scales(role.checkpoint_step.output_dir, s.tp_size, s.pp_size)
            digests[s.role] = scales[s.role].digest
        elif (kept := load_manifest(role.engine_dir).kv_scales_digest) is not None:
            digests[s.role] = kept
    if len(scales) == 2:
        require_same_scales(scales["prefill"], scales["decode"])
    elif len(set(digests.values())) > 1:
        raise KvScalesError(f"kv_scales_digest differs: prefill {digests['prefill']}, decode {digests['decode']} "
                            f"(two calibrations); rebuild both roles with --force")
    return digests


def _build_role(role: RolePlan, manifest: EngineManifest, checkpoint_record: StepRecord, runner: Runner,
                report: Report, logs: Path) -> EngineManifest:
    build = role.build_step
    records = [checkpoint_record, manifest.steps[1]]
    log_path = logs / f"trtllm-build-{role.engine_dir.name}.log"
    records[1] = records[1].model_copy(update={"log_path": str(log_path)})
    try:
        duration_s = run_step(build, runner, log_path, report)
    except BuildStepError as exc:
        _fail_role(role, manifest.model_copy(update={"steps": records}), str(exc), checkpoint_records=None)
        raise
    records[1] = records[1].model_copy(update={"status": "ok", "duration_s": round(duration_s, 3)})
    final = manifest.model_copy(update={"status": "complete", "steps": records, "updated_at": now_iso(),
                                        "checksums": checksums(role.engine_dir)})
    write_manifest(final, role.engine_dir)
    report(f"{role.engine_dir.name}: complete ({len(final.checksums)} files, manifest written)")
    return final


def _run_checkpoint(step: Step, runner: Runner, report: Report, logs: Path) -> StepRecord:
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
    return record.model_copy(update={"status": "ok", "duration_s": round(duration_s, 3)})

"""The build plan per role: checkpoint conversion, then trtllm-build, as exact commands.

TP and PP are baked into a TensorRT-LLM checkpoint (quantize.py --tp_size), so each distinct
(TP, PP) gets its own checkpoint folder, shared by the roles that use it. trtllm-build has no
KV-dtype flag: FP8 KV comes from the checkpoint's kv_cache_quant_algo (trtllm-1.2.md §1.2). Two
FP8 checkpoints are two calibrations; execute.py compares their KV scales (kv_scales.py).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from trtpd import __version__
from trtpd.schema.manifest import (BuildInputs, EngineBuildConfig, EngineManifest, ModelShape, StepRecord,
                                   engine_folder_name)
from trtpd.trtllm.options import check_args, require_valid
from trtpd.trtllm.spec import BuildRequest, EngineRoleSpec
from trtpd.trtllm.versions import PINNED

Args = tuple[tuple[str, "str | None"], ...]


@dataclass(frozen=True)
class Step:
    name: str                       # "quantize", "convert" or "trtllm-build"
    tool: str                       # options-table tool the args are checked against
    program: tuple[str, ...]
    args: Args
    output_dir: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def argv(self) -> list[str]:
        argv = list(self.program)
        for flag, value in self.args:
            argv.append(flag)
            if value is not None:
                argv.append(value)
        return argv

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + shlex.join(self.argv)

    def record(self) -> StepRecord:
        return StepRecord(name=self.name, argv=self.argv, env=dict(self.env), output_dir=str(self.output_dir))


@dataclass(frozen=True)
class RolePlan:
    spec: EngineRoleSpec
    engine_dir: Path
    checkpoint_step: Step
    build_step: Step
    manifest: EngineManifest        # status "planned"

    @property
    def steps(self) -> tuple[Step, Step]:
        return (self.checkpoint_step, self.build_step)


@dataclass(frozen=True)
class BuildPlan:
    request: BuildRequest
    prefill: RolePlan
    decode: RolePlan

    @property
    def roles(self) -> tuple[RolePlan, RolePlan]:
        return (self.prefill, self.decode)

    def unique_steps(self) -> list[Step]:
        """Steps in run order (execute.py): every checkpoint, then every engine, so that two FP8 calibrations are
        compared before any engine is built; a checkpoint shared by both roles is converted once."""
        seen, steps = set(), []
        for step in [r.checkpoint_step for r in self.roles] + [r.build_step for r in self.roles]:
            if step.output_dir not in seen:
                seen.add(step.output_dir)
                steps.append(step)
        return steps


def checkpoint_dir(r: BuildRequest, spec: EngineRoleSpec) -> Path:
    precision = "fp8" if r.fp8 else r.weights_dtype
    suffix = f"-pp{spec.pp_size}" if spec.pp_size > 1 else ""
    return r.model_dir / "checkpoints" / f"{precision}-tp{spec.tp_size}{suffix}"


def checkpoint_step(r: BuildRequest, spec: EngineRoleSpec) -> Step:
    out = checkpoint_dir(r, spec)
    common = (("--model_dir", r.model_source),)
    if r.fp8:
        args = common + (("--dtype", r.weights_dtype), ("--qformat", "fp8"), ("--kv_cache_dtype", "fp8"),
                         ("--calib_size", str(r.calib_size)), ("--tp_size", str(spec.tp_size)),
                         ("--pp_size", str(spec.pp_size)), ("--output_dir", str(out)))
        step = Step("quantize", "quantize.py", ("python3", f"{r.examples_dir}/quantization/quantize.py"), args, out)
    else:
        args = common + (("--output_dir", str(out)), ("--dtype", r.weights_dtype), ("--tp_size", str(spec.tp_size)),
                         ("--pp_size", str(spec.pp_size)))
        step = Step("convert", "convert_checkpoint.py",
                    ("python3", f"{r.examples_dir}/models/core/llama/convert_checkpoint.py"), args, out)
    require_valid(check_args(step.tool, step.args), f"{step.name} command for {spec.role}")
    return step


def build_step(r: BuildRequest, spec: EngineRoleSpec, engine_dir: Path) -> Step:
    flags = dict(r.build_flags)
    flags["gemm_plugin"] = "disable" if r.fp8 else flags.get("gemm_plugin", "auto")
    flags["use_fp8_context_fmha"] = "enable" if r.fp8 else "disable"
    if flags["gemm_plugin"] == "disable" and "opt_num_tokens" not in flags:
        # Without the GEMM plugin TensorRT picks GEMM tactics per optimization profile; TensorRT-LLM's perf
        # guidance recommends --multiple_profiles "especially when GEMM plugin is disabled" (trtllm-1.2.md §6).
        # It is incompatible with --opt_num_tokens (RuntimeError in build.py), hence the guard.
        flags.setdefault("multiple_profiles", "enable")
    args: Args = (
        ("--checkpoint_dir", str(checkpoint_dir(r, spec))), ("--output_dir", str(engine_dir)),
        ("--max_batch_size", str(spec.max_batch_size)), ("--max_input_len", str(spec.max_input_len)),
        ("--max_seq_len", str(spec.max_seq_len)), ("--max_num_tokens", str(spec.max_num_tokens)),
        ("--max_beam_width", str(spec.max_beam_width)), ("--kv_cache_type", "paged"),
        ("--tokens_per_block", str(r.tokens_per_block)),
    ) + tuple((f"--{k}", v) for k, v in sorted(flags.items())) + (("--workers", str(spec.gpus_per_instance)),)
    step = Step("trtllm-build", "trtllm-build", ("trtllm-build",), args, engine_dir)
    require_valid(check_args(step.tool, step.args), f"trtllm-build command for {spec.role}")
    return step


def planned_manifest(r: BuildRequest, spec: EngineRoleSpec, steps: tuple[Step, Step]) -> EngineManifest:
    return EngineManifest(
        backend="tensorrtllm", role=spec.role, model=ModelShape.of(r.model),
        build_config=EngineBuildConfig(
            kv_dtype=r.kv_dtype, tokens_per_block=r.tokens_per_block, max_batch_size=spec.max_batch_size,
            max_num_tokens=spec.max_num_tokens, max_input_len=spec.max_input_len, max_seq_len=spec.max_seq_len,
            max_beam_width=spec.max_beam_width, tp_size=spec.tp_size, pp_size=spec.pp_size),
        inputs=BuildInputs(model_source=r.model_source, checkpoint_dir=str(checkpoint_dir(r, spec)),
                           weights_dtype=r.weights_dtype, quantization="fp8" if r.fp8 else "none",
                           kv_cache_quant_algo="FP8" if r.fp8 else "none"),
        steps=[s.record() for s in steps],
        versions={"trtpd": __version__, **PINNED.as_dict()},
        status="planned")


def plan_role(r: BuildRequest, spec: EngineRoleSpec) -> RolePlan:
    engine_dir = r.model_dir / engine_folder_name(spec.role, spec.tp_size, spec.pp_size)
    steps = (checkpoint_step(r, spec), build_step(r, spec, engine_dir))
    return RolePlan(spec, engine_dir, steps[0], steps[1], planned_manifest(r, spec, steps))


def plan_build(r: BuildRequest) -> BuildPlan:
    return BuildPlan(r, plan_role(r, r.prefill), plan_role(r, r.decode))

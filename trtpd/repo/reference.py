"""The model repository for the CPU reference backend, disaggregated or colocated.

disaggregated: ensemble -> preprocessing -> disagg_bls -> {prefill, decode} -> postprocessing
colocated:     ensemble -> preprocessing -> disagg_bls -> colocated -> postprocessing
Both modes use the same ensemble, pre/post-processing and orchestrator, so they are compared on
the same wiring. The deployment's KV signing key is generated next to the repository (0600).
The deployment spec itself is trtpd.deploy.spec; the P/D rules are trtpd.lint.engine_pair.
"""

from __future__ import annotations

import shutil
from pathlib import Path

# KEY_FILE, ReferenceDeployment and check_pair are imported from here by trtpd.fleet and trtpd.bench.run
from trtpd.deploy.spec import KEY_FILE, KV_TRANSPORTS, MODES, ReferenceDeployment, key_file_for
from trtpd.engine.engine_config import EngineConfig, Role
from trtpd.errors import ConfigError
from trtpd.lint import check_pair, lint_repository
from trtpd.perf_outputs import PERF_OUTPUTS
from trtpd.repo.render import ModelPlan, render_repository

__all__ = ["KEY_FILE", "KV_TRANSPORTS", "MODES", "ReferenceDeployment", "check_pair", "default_build_root",
           "render_reference_repository", "repository_plan"]


def repository_plan(dep: ReferenceDeployment, key_file: Path) -> list[ModelPlan]:
    if dep.mode not in MODES:
        raise ConfigError(f"mode {dep.mode!r}: use one of {', '.join(MODES)}")
    if dep.kv_transport not in KV_TRANSPORTS:
        raise ConfigError(f"kv_transport {dep.kv_transport!r}: use one of {', '.join(KV_TRANSPORTS)}")
    roles = [Role.PREFILL, Role.DECODE] if dep.mode == "disaggregated" else [Role.COLOCATED]
    engines = {role: dep.engine(role) for role in roles}
    first = EngineConfig.load(engines[roles[0]])
    checkpoint = first.checkpoint_path(engines[roles[0]])
    common = {"max_batch_size": dep.max_batch_size}
    counts = {Role.PREFILL: dep.prefill_instances, Role.DECODE: dep.decode_instances,
              Role.COLOCATED: dep.colocated_instances}
    plans = [
        ModelPlan("preprocessing", "preprocessing", {**common, "tokenizer_dir": checkpoint, "instance_count": 1,
                                                     "max_input_len": first.max_input_len,
                                                     "max_output_len": first.max_output_len}),
        ModelPlan("postprocessing", "postprocessing", {**common, "tokenizer_dir": checkpoint, "instance_count": 1}),
        ModelPlan("disagg_bls", "disagg_bls", {**common, "mode": dep.mode, "context_model_name": "prefill",
                                               "generation_model_name": "decode", "colocated_model_name": "colocated",
                                               "kv_transfer": dep.kv_transfer, "perf_outputs": ",".join(PERF_OUTPUTS),
                                               "kv_key_file": key_file.resolve(), "instance_count": dep.bls_instances,
                                               "fleet_file": ""}),
        ModelPlan("ensemble", "ensemble", {**common, "preprocessing_model": "preprocessing",
                                           "bls_model": "disagg_bls", "postprocessing_model": "postprocessing"}),
    ]
    for role in roles:
        plans.append(ModelPlan(role.value, "reference", {
            **common, "role": role.value, "engine_dir": engines[role], "kv_transport": dep.kv_transport,
            "kv_key_file": key_file.resolve(), "kv_transfer_timeout_ms": dep.kv_transfer_timeout_ms,
            "num_threads": 1, "instance_count": counts[role], "instance_name": role.value,
            "kv_host": "127.0.0.1", "kv_port": 0, "kv_advertise_host": "127.0.0.1", "step_delay_ms": 0}))
    return plans


def render_reference_repository(dep: ReferenceDeployment, out_dir: Path, *, overwrite: bool = False,
                                check_compatibility: bool = True) -> Path:
    from trtpd.kv.handle import load_or_create_key_file

    if dep.mode == "disaggregated" and check_compatibility:
        problems = check_pair(dep.engine(Role.PREFILL), dep.engine(Role.DECODE))
        if problems:
            raise ConfigError("prefill and decode engines are not compatible:\n  " + "\n  ".join(problems))
    out_dir = Path(out_dir).resolve()
    key_file = key_file_for(out_dir)
    plans = repository_plan(dep, key_file)
    render_repository(plans, out_dir, overwrite=overwrite)
    problems = [f"[{f.rule}] {f.subject}: {f.message}; fix: {f.fix}" for f in lint_repository(out_dir)
                if f.severity == "error"]
    if problems:
        shutil.rmtree(out_dir)
        raise ConfigError(f"{out_dir}: the rendered repository fails trtpd lint:\n  " + "\n  ".join(problems))
    load_or_create_key_file(key_file)
    return out_dir


def default_build_root(engines_dir: Path, model: str, kv_dtype: str) -> Path:
    from trtpd.engine.reference_engines import engine_dir   # torch: only when a build root is asked for
    return engine_dir(engines_dir, model, kv_dtype, Role.PREFILL).parent

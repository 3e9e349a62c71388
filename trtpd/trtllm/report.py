"""Human-readable build plan: what `trtpd build --dry-run` prints (and the golden `plan.txt`)."""

from __future__ import annotations

from trtpd.trtllm.containers import CONTAINERS, DEFAULT_CONTAINER
from trtpd.trtllm.deploy import REPO_DIR, SERVE_PYTORCH_DIR, TRITON_LAUNCH, DeployPlan
from trtpd.trtllm.launch import PYTHON_DIR
from trtpd.trtllm.transfer_buffer import transfer_buffer_env, transfer_buffer_tokens
from trtpd.schema.manifest import MANIFEST_NAME
from trtpd.trtllm.plan import BuildPlan
from trtpd.trtllm.serve_pytorch import plan_checkpoint
from trtpd.trtllm.versions import PINNED
from trtpd.lint.findings import Finding, summary


def describe_precision(plan: BuildPlan) -> str:
    r = plan.request
    return "FP8 weights + FP8 KV cache" if r.fp8 else f"{r.weights_dtype} weights + {r.kv_dtype.value} KV cache"


def _kv_pool(s) -> str:
    text = f"{s.role} kv_cache_free_gpu_mem_fraction {s.kv_cache_free_gpu_mem_fraction:g}"
    if s.kv_cache_max_tokens is not None:
        text += (f" and at most {s.kv_cache_max_tokens} tokens (max_batch_size x max_seq_len; trtllm-serve "
                 f"kv_cache_config.max_tokens, Triton max_tokens_in_paged_kv_cache)")
    if s.cuda_graph_mode:
        text += f", {s.cuda_graph_cache_size} CUDA graphs cached"
    return text


def _pytorch_target(plan: BuildPlan) -> str:
    c = plan_checkpoint(plan.request)
    how = {"hf_ptq.py": "ModelOpt hf_ptq.py, one FP8 calibration for both roles, KV dtype fp8",
           "hf download": "fetched once, so the servers download nothing"}
    loads = f"{c.model} ({SERVE_PYTORCH_DIR}/checkpoint.sh: {how[c.tool]})" if c.needs_step else f"{c.model} as it is"
    return (f"  trtllm-serve --backend pytorch ({SERVE_PYTORCH_DIR}/, no engine): loads {loads}; the servers register "
            f"with the router's disagg_cluster")


def format_plan(plan: BuildPlan, deploy: DeployPlan, findings: list[Finding]) -> str:
    r = plan.request
    lines = [f"trtpd build plan: {r.model.name} for TensorRT-LLM {PINNED.tensorrt_llm} (Triton {PINNED.triton_container}), "
             f"{describe_precision(plan)}, tokens_per_block {r.tokens_per_block}",
             f"  source: {r.model_source}; longest prompt {r.max_input_len} tokens, longest output {r.max_output_len}"]
    for role in plan.roles:
        s = role.spec
        lines.append(f"  {s.role + ':':8} TP{s.tp_size} PP{s.pp_size} x{s.instances}, max_batch_size {s.max_batch_size}, "
                     f"max_num_tokens {s.max_num_tokens}, max_input_len {s.max_input_len}, "
                     f"max_seq_len {s.max_seq_len} -> {role.engine_dir}")
    lines.append("  KV pool: " + "; ".join(_kv_pool(s) for s in r.roles))
    w = deploy.world
    lines.append(f"  MPI world (Triton tensorrtllm backend): {w.world_size} ranks = 1 orchestrator + "
                 + " + ".join(f"{sum(len(i.ranks) for i in w.instances(s.role))} {s.role}" for s in r.roles)
                 + ", " + " ".join(f"{k}={v}" for k, v in transfer_buffer_env(plan).items()))
    lines.append(f"  trtllm-serve KV transfer: {r.transceiver_backend}, max_tokens_in_buffer "
                 f"{transfer_buffer_tokens(r.max_input_len, r.tokens_per_block)}, "
                 f"kv_transfer_timeout_ms {r.kv_transfer_timeout_ms}")
    lines.append(_pytorch_target(plan))
    if r.fp8:
        checkpoints = sorted({role.checkpoint_step.output_dir.name for role in plan.roles})
        lines.append(f"  FP8 KV scales: " + ("one calibration, one checkpoint for both roles" if len(checkpoints) == 1
                     else f"two calibrations ({', '.join(checkpoints)}): both run before any engine, their KV scales "
                          f"are read back and compared (a mismatch stops the build)")
                     + "; each manifest records kv_scales_digest")
    c = deploy.container
    lines.append(f"  container: {c.name} ({c.image}), TensorRT-LLM examples in {r.examples_dir}")
    if not c.has_tritonserver:
        lines.append(f"  Triton path: not in {c.image} (no tritonserver); run {TRITON_LAUNCH} in "
                     f"{CONTAINERS[DEFAULT_CONTAINER].image}")
    for warning in r.warnings:
        lines.append(f"  warning: {warning}")
    lines.append("")
    for n, step in enumerate(plan.unique_steps(), start=1):
        users = [role.spec.role for role in plan.roles if step in role.steps]
        lines.append(f"# {n}. {step.name} -> {step.output_dir.name} (for {', '.join(users)})")
        lines.append(step.shell())
        lines.append("")
    lines.append("files a build writes:")
    for role in plan.roles:
        lines.append(f"  {role.engine_dir / MANIFEST_NAME}")
    for model in deploy.models:
        lines.append(f"  {deploy.deploy_dir / REPO_DIR / model.name / 'config.pbtxt'}")
    for rel in sorted(deploy.files):
        lines.append(f"  {deploy.deploy_dir / rel}")
    lines.append(f"  {deploy.deploy_dir / PYTHON_DIR / 'trtpd'}/ (trtpd's source, imported by the python models)")
    lines.append("")
    lines.extend(f.format() for f in findings)
    lines.append(summary(findings))
    return "\n".join(lines) + "\n"

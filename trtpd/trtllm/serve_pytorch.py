"""The trtllm-serve deployment on TensorRT-LLM's PyTorch backend: no engine, the default GPU target.

`deploy/serve-pytorch/` holds checkpoint.sh (FP8 only), prefill.yaml, decode.yaml, disagg.yaml and launch.sh:
context and generation servers `trtllm-serve <Hugging Face checkpoint> --backend pytorch` that register with the
router's `disagg_cluster` (no static urls), KV over `cache_transceiver_config`. TensorRT-LLM deleted the engine
path on main (trtllm-1.2.md §0); every disaggregation fix and `kv_transfer_timeout_ms` itself land on this one.

Why every GPU `trtpd build` writes this folder next to trtllm-serve/ (engines), rather than a flag that picks one:
- one BuildRequest sizes both targets (batches, token budgets, lengths, KV pool, transfer buffer, instances and
  their GPUs), so they cannot drift apart; a flag would fork the plan and need a second set of refusals;
- nothing here is built: `trtpd build --configs-only` writes it on a machine without GPUs, and its one step, the
  FP8 calibration, is checkpoint.sh, run where the GPUs are;
- the engine path (trtllm-serve/, the Triton repository, their goldens) stays as it was, byte for byte.

FP8: ModelOpt's hf_ptq.py calibrates once and exports a unified Hugging Face checkpoint (hf_quant_config.json:
FP8 weights, FP8 KV scales) that the PyTorch backend shards at load time, so prefill TP2 and decode TP4 read one
checkpoint, one calibration (the engine path needs one per TP: docs/gpu-build.md). Without FP8 the servers load
the model source as it is. Sources of every key and flag: options_table.py; the choices: docs/gpu-build.md.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from trtpd import __version__
from trtpd.schema.trtllm_serve import PERF_METRICS_MAX_REQUESTS
from trtpd.trtllm.mpi_world import RankLayout
from trtpd.trtllm.options import check_args, check_keys, require_valid
from trtpd.trtllm.plan import BuildPlan, RolePlan
from trtpd.trtllm.serve_config import (ServeLayout, WorkerCommand, router_command_line, server_args, ucx_lines,
                                       worker_slots, yaml_text)
from trtpd.trtllm.spec import BuildRequest
from trtpd.trtllm.tokenizer_files import TOKENIZER_DIR, guard_lines
from trtpd.trtllm.transfer_buffer import transfer_buffer_tokens
from trtpd.trtllm.versions import PINNED

MODELOPT_TAG = "0.37.0"          # TensorRT-LLM 1.2.x requirements.txt: nvidia-modelopt[torch]~=0.37.0
MODELOPT_REPO = "https://github.com/NVIDIA/Model-Optimizer"     # formerly NVIDIA/TensorRT-Model-Optimizer
HF_PTQ = "examples/llm_ptq/hf_ptq.py"
FP8_CHECKPOINT = "hf-fp8"        # under engines/<model>/checkpoints/, beside the engine path's fp8-tp<N>
HUB_CHECKPOINT = "hf"            # a hub model's files, fetched once by checkpoint.sh: the servers download nothing
QUANT_CONFIG = "hf_quant_config.json"     # export_hf_checkpoint's quantization record (written before the weights)
COMPLETE = ".trtpd-checkpoint-complete"   # checkpoint.sh writes it once its step exited 0: the folder is whole
HEARTBEAT_INTERVAL_S = 5         # DisaggClusterConfig's defaults: a worker re-arms its 10 s registration every 5 s
INACTIVE_TIMEOUT_S = 10
SERVER_ROLE = {"prefill": "CONTEXT", "decode": "GENERATION"}


@dataclass(frozen=True)
class PytorchCheckpoint:
    model: str                      # what every server loads: always a local folder
    tool: str = ""                  # the step's options-table tool: "hf_ptq.py", "hf download", or "" (no step)
    args: tuple[tuple[str, str], ...] = ()
    repo_id: str = ""               # hf download's positional argument

    @property
    def needs_step(self) -> bool:
        return bool(self.tool)

    def command(self) -> str:
        """The step as checkpoint.sh runs it (hf_ptq.py from $MODELOPT_DIR; hf download REPO --local-dir DIR)."""
        flags = shlex.join(t for pair in self.args for t in pair)
        if self.tool == "hf_ptq.py":
            return f'python3 "$MODELOPT_DIR/{HF_PTQ}" {flags}'
        return f"hf download {shlex.quote(self.repo_id)} {flags}"


def plan_checkpoint(r: BuildRequest) -> PytorchCheckpoint:
    """FP8: hf_ptq.py --qformat fp8 --kv_cache_qformat fp8 into checkpoints/hf-fp8. Else a local model folder as it
    is, or a hub model fetched into checkpoints/hf (as the engine path's convert step fetches it into the cache)."""
    checkpoints = r.model_dir / "checkpoints"
    if r.fp8:
        out = checkpoints / FP8_CHECKPOINT
        args = (("--pyt_ckpt_path", r.model_source), ("--qformat", "fp8"), ("--kv_cache_qformat", "fp8"),
                ("--calib_size", str(r.calib_size)), ("--dataset", "cnn_dailymail"), ("--export_path", str(out)))
        tool = "hf_ptq.py"
    elif Path(r.model_source).is_dir():
        return PytorchCheckpoint(str(Path(r.model_source).resolve()))
    else:
        out, tool = checkpoints / HUB_CHECKPOINT, "hf download"
        args = (("--local-dir", str(out)),)
    require_valid(check_args(tool, args), f"{tool} command for serve-pytorch/checkpoint.sh")
    return PytorchCheckpoint(str(out), tool, args, repo_id=r.model_source)


def cluster_uri(layout: ServeLayout) -> str:
    """The router serves the cluster storage itself for an http:// URI (HttpClusterStorageServer on its app)."""
    return f"http://{layout.host}:{layout.router_port}"


def worker_cluster(r: BuildRequest, layout: ServeLayout) -> dict:
    """A worker's disagg_cluster: the router's name and URI (a YAML cluster_uri wins over --disagg_cluster_uri in
    1.2's extract_disagg_cluster_config, so both carry the same one), and its heartbeat inside its registration's
    TTL (a heartbeat starts only when 0 < heartbeat_interval_sec < inactive_timeout_sec)."""
    return {"cluster_uri": cluster_uri(layout), "cluster_name": f"trtpd-{r.model.name}",
            "heartbeat_interval_sec": HEARTBEAT_INTERVAL_S, "inactive_timeout_sec": INACTIVE_TIMEOUT_S}


def role_options(plan: BuildPlan, role: RolePlan, layout: ServeLayout) -> dict:
    """One role's --extra_llm_api_options for TorchLlmArgs (TensorRT-only keys such as
    extended_runtime_perf_knob_config would be refused: TorchLlmArgs forbids unknown keys)."""
    r, s = plan.request, role.spec
    kv: dict = {"enable_block_reuse": s.enable_kv_cache_reuse and s.role != "prefill",
                "free_gpu_memory_fraction": s.kv_cache_free_gpu_mem_fraction, "tokens_per_block": r.tokens_per_block}
    if r.fp8:
        kv["dtype"] = "fp8"
    if s.kv_cache_max_tokens is not None:
        kv["max_tokens"] = s.kv_cache_max_tokens
    options = {
        "max_batch_size": s.max_batch_size, "max_num_tokens": s.max_num_tokens,
        "enable_chunked_prefill": s.enable_chunked_context,
        "disable_overlap_scheduler": s.role == "prefill",
        "enable_iter_perf_stats": True,
        # the per-request records trtpd's gateway reads for the TTFT breakdown (/perf_metrics)
        "return_perf_metrics": True, "perf_metrics_max_requests": PERF_METRICS_MAX_REQUESTS,
        "kv_cache_config": kv,
        "cache_transceiver_config": {"backend": r.transceiver_backend,
                                     "max_tokens_in_buffer": transfer_buffer_tokens(r.max_input_len, r.tokens_per_block),
                                     "kv_transfer_timeout_ms": r.kv_transfer_timeout_ms},
        "disagg_cluster": worker_cluster(r, layout),
    }
    require_valid(check_keys("torch-llm-api-options", options), f"{s.role} extra_llm_api_options (PyTorch backend)")
    return options


def worker_commands(plan: BuildPlan, world: RankLayout, layout: ServeLayout, checkpoint: PytorchCheckpoint,
                    options_dir: str) -> list[WorkerCommand]:
    commands = []
    for slot in worker_slots(plan, world, layout):
        s = slot.role.spec
        args = server_args(plan, slot, layout, "pytorch") + [
            ("--server_role", SERVER_ROLE[s.role]), ("--disagg_cluster_uri", cluster_uri(layout)),
            ("--extra_llm_api_options", f"{options_dir}/{s.role}.yaml")]
        require_valid(check_args("trtllm-serve", args), f"trtllm-serve --backend pytorch command for {s.role} "
                                                        f"{slot.index}")
        commands.append(WorkerCommand(s.role, slot.index, slot.port, slot.cuda_visible_devices, args,
                                      checkpoint.model))
    return commands


def router_config(r: BuildRequest, layout: ServeLayout) -> dict:
    """Readiness waits for every planned server: minimal_instances are the plan's instance counts."""
    cluster = {**worker_cluster(r, layout), "minimal_instances": {"context_servers": r.prefill.instances,
                                                                  "generation_servers": r.decode.instances}}
    config = {"hostname": layout.host, "port": layout.router_port, "disagg_cluster": cluster}
    require_valid(check_keys("disagg-config", config), "disaggregated router config (disagg_cluster)")
    return config


def checkpoint_script(plan: BuildPlan, checkpoint: PytorchCheckpoint, stamp: str) -> str:
    r = plan.request
    lines = ["#!/usr/bin/env bash", f"# The checkpoint the PyTorch-backend servers of {r.model.name} load. {stamp}"]
    if checkpoint.tool == "hf_ptq.py":
        lines += [
            f"# ModelOpt's {HF_PTQ} calibrates once and exports a unified Hugging Face checkpoint (FP8 weights, FP8 "
            f"KV",
            f"# scales, {QUANT_CONFIG}); the servers shard it at load time, so both roles read this one checkpoint.",
            f"# TensorRT-LLM {PINNED.tensorrt_llm} installs nvidia-modelopt {MODELOPT_TAG[:-2]}.x but not its "
            f"examples: MODELOPT_DIR is a checkout",
            f"# of {MODELOPT_REPO} at tag {MODELOPT_TAG}. Calibration reads cnn_dailymail from the Hugging Face Hub.",
            "set -euo pipefail",
            f'MODELOPT_DIR="${{MODELOPT_DIR:-{r.modelopt_dir or ""}}}"',
            f'if [ ! -f "$MODELOPT_DIR/{HF_PTQ}" ]; then',
            f'  echo "checkpoint.sh: no {HF_PTQ} under MODELOPT_DIR=$MODELOPT_DIR; set MODELOPT_DIR to a checkout of '
            f'{MODELOPT_REPO} at tag {MODELOPT_TAG} (or rerun trtpd build --configs-only --force '
            f'--modelopt-dir DIR)" >&2',
            "  exit 1",
            "fi"]
    else:
        lines += ["# The Hugging Face checkpoint, fetched once here (HF_TOKEN set for a gated model) so that the",
                  "# servers download nothing when they start; huggingface_hub's `hf` CLI comes with TensorRT-LLM's",
                  "# transformers.",
                  "set -euo pipefail"]
    lines += [checkpoint.command(), f'touch "{checkpoint.model}/{COMPLETE}"', ""]
    return "\n".join(lines)


def launch_script(plan: BuildPlan, workers: list[WorkerCommand], checkpoint: PytorchCheckpoint, stamp: str) -> str:
    r = plan.request
    lines = ["#!/usr/bin/env bash", f"# trtllm-serve disaggregated deployment of {r.model.name}, no engine. {stamp}",
             f"# KV transfer: {r.transceiver_backend} (cache_transceiver_config in prefill.yaml/decode.yaml); the "
             f"servers register with the router's disagg_cluster (disagg.yaml).",
             "set -euo pipefail", 'cd "$(dirname "$0")"', *guard_lines("launch.sh", "../" + TOKENIZER_DIR)]
    if checkpoint.needs_step:
        lines += [f'if [ ! -f "{checkpoint.model}/{COMPLETE}" ]; then',
                  f'  echo "launch.sh: {checkpoint.model} is not complete: run ./checkpoint.sh first" >&2',
                  "  exit 1",
                  "fi"]
    lines += ucx_lines()
    lines += [w.shell(f"{w.role}-{w.index}.log") for w in workers]
    lines.append(router_command_line())
    return "\n".join(lines) + "\n"


def _role_header(plan: BuildPlan, role: RolePlan, stamp: str) -> list[str]:
    r, s = plan.request, role.spec
    kv = "fp8 (the checkpoint's FP8 KV scales)" if r.fp8 else "auto: the checkpoint's dtype"
    return [
        f"extra_llm_api_options for the {s.role} servers of {r.model.name}. {stamp}",
        ("Context servers: KV reuse off (NVIDIA/TensorRT-LLM#12542) and the overlap scheduler off (not supported "
         "on disaggregated context servers)." if s.role == "prefill" else f"KV reuse is "
         f"{'on' if s.enable_kv_cache_reuse else 'off'}; the overlap scheduler stays on."),
        f"KV dtype {kv}; tokens_per_block {r.tokens_per_block}, equal on both roles or the transfer is refused.",
        f"max_tokens_in_buffer = longest prompt ({r.max_input_len} tokens) + one block. kv_transfer_timeout_ms is",
        "enforced here (the PyTorch executor, _torch/pyexecutor/py_executor.py): a transfer to a lost peer is",
        "cancelled and its KV freed. enable_iter_perf_stats: /metrics returns iteration stats only with it.",
        "disagg_cluster: the router's (disagg.yaml); serve.py takes it out before the rest become LLM args.",
    ]


def render_pytorch_serve_files(plan: BuildPlan, world: RankLayout, layout: ServeLayout,
                               folder: str) -> dict[str, str]:
    """{relative path: text} for checkpoint.sh (FP8), prefill.yaml, decode.yaml, disagg.yaml, launch.sh."""
    r = plan.request
    stamp = (f"Generated by trtpd {__version__} for TensorRT-LLM {PINNED.tensorrt_llm} "
             f"(trtllm-serve --backend pytorch).")
    checkpoint = plan_checkpoint(r)
    files = {f"{folder}/{role.spec.role}.yaml": yaml_text(_role_header(plan, role, stamp),
                                                          role_options(plan, role, layout))
             for role in plan.roles}
    files[f"{folder}/disagg.yaml"] = yaml_text([
        f"trtllm-serve disaggregated router for {r.model.name}. {stamp}",
        "disagg_cluster instead of static urls: servers register at cluster_uri (this router) and stay while their",
        "heartbeats arrive; /health answers 200 once minimal_instances of each role are registered.",
    ], router_config(r, layout))
    if checkpoint.needs_step:
        files[f"{folder}/checkpoint.sh"] = checkpoint_script(plan, checkpoint, stamp)
    files[f"{folder}/launch.sh"] = launch_script(plan, worker_commands(plan, world, layout, checkpoint, "."),
                                                 checkpoint, stamp)
    return files

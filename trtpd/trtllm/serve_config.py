"""The trtllm-serve path: per-role LLM API options, the disaggregated router config, launch commands.

Separate context and generation servers (`trtllm-serve <engine_dir> --backend tensorrt`) exchange
KV through `cache_transceiver_config` (UCX by default, NIXL optional); `trtllm-serve disaggregated`
routes context_only then generation_only requests (trtllm-1.2.md §2.1, §2.3). Size flags are passed
explicitly: trtllm-serve's own defaults (max_num_tokens 8192, max_batch_size 2048) would otherwise
clamp the engine's runtime limits (llm_args validate_build_config_with_runtime_params).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import yaml

from trtpd import __version__
from trtpd.trtllm.mpi_world import RankLayout
from trtpd.trtllm.options import check_args, check_keys, require_valid
from trtpd.trtllm.plan import BuildPlan, RolePlan
from trtpd.trtllm.tokenizer_files import TOKENIZER_DIR, guard_lines, served_tokenizer_dir
from trtpd.trtllm.transfer_buffer import transfer_buffer_tokens
from trtpd.trtllm.versions import PINNED

SERVER_START_TIMEOUT_S = 900        # loading a 70B engine on every rank takes minutes, not 180 s

# UCX settings for the KV transceiver, each with its source (options_table._UCX):
#   UCX_MEMTYPE_CACHE=n: TensorRT-LLM's disaggregated-service doc (NVIDIA/TensorRT-LLM#2518): UCX's memory-type
#     cache misdetects CUDA buffers; off is the documented setting.
#   UCX_CUDA_IPC_ENABLE_MNNVL=n, UCX_RNDV_SCHEME=put_zcopy: kv_cache_transceiver.py create_kv_cache_transceiver logs
#     them for devices not in one NVLink domain (hangs, cuMemImportFromShareableHandle errors); one node without
#     multi-node NVLink is such a case, so trtpd sets both. On a GB200 NVL72 domain set UCX_CUDA_IPC_ENABLE_MNNVL=y.
UCX_ENV = {"UCX_MEMTYPE_CACHE": "n", "UCX_CUDA_IPC_ENABLE_MNNVL": "n", "UCX_RNDV_SCHEME": "put_zcopy"}
ROUTER_SECTION = {"prefill": "context_servers", "decode": "generation_servers"}


@dataclass(frozen=True)
class ServeLayout:
    host: str = "localhost"
    router_port: int = 8000
    first_worker_port: int = 8100

    def worker_port(self, index: int) -> int:
        return self.first_worker_port + index


@dataclass(frozen=True)
class WorkerCommand:
    role: str
    index: int
    port: int
    cuda_visible_devices: str
    args: list[tuple[str, str | None]]
    model: str                      # what trtllm-serve loads: an engine folder, or a Hugging Face checkpoint

    @property
    def argv(self) -> list[str]:
        return ["trtllm-serve", self.model] + [t for f, v in self.args for t in ((f,) if v is None else (f, v))]

    def shell(self, log_name: str) -> str:
        return f"CUDA_VISIBLE_DEVICES={self.cuda_visible_devices} {shlex.join(self.argv)} > {log_name} 2>&1 &"


@dataclass(frozen=True)
class WorkerSlot:
    role: RolePlan
    index: int                      # the instance within its role
    port: int
    cuda_visible_devices: str


def worker_slots(plan: BuildPlan, world: RankLayout, layout: ServeLayout) -> list[WorkerSlot]:
    """Every server of both paths: prefill instances first, each on its own port and its planned GPUs."""
    slots = []
    for role in plan.roles:
        for inst in world.instances(role.spec.role):
            slots.append(WorkerSlot(role, inst.index, layout.worker_port(len(slots)), ",".join(map(str, inst.gpu_ids))))
    return slots


def role_llm_options(plan: BuildPlan, role: RolePlan) -> dict:
    """The --extra_llm_api_options YAML for one role (nested keys as the LLM API reads them)."""
    r, s = plan.request, role.spec
    options: dict = {
        "kv_cache_config": {"enable_block_reuse": s.enable_kv_cache_reuse,
                            "free_gpu_memory_fraction": s.kv_cache_free_gpu_mem_fraction},
        "cache_transceiver_config": {"backend": r.transceiver_backend,
                                     "max_tokens_in_buffer": transfer_buffer_tokens(r.max_input_len, r.tokens_per_block),
                                     "kv_transfer_timeout_ms": r.kv_transfer_timeout_ms},
        "enable_chunked_prefill": s.enable_chunked_context,
    }
    if s.kv_cache_max_tokens is not None:      # the smaller of this and the fraction (recipes/tensorrtllm/decode.yaml)
        options["kv_cache_config"]["max_tokens"] = s.kv_cache_max_tokens
    if s.cuda_graph_mode:
        options["extended_runtime_perf_knob_config"] = {"cuda_graph_mode": True,
                                                        "cuda_graph_cache_size": s.cuda_graph_cache_size,
                                                        "multi_block_mode": s.multi_block_mode}
    require_valid(check_keys("llm-api-options", options), f"{s.role} extra_llm_api_options")
    return options


def server_args(plan: BuildPlan, slot: WorkerSlot, layout: ServeLayout, backend: str) -> list[tuple[str, str | None]]:
    """The flags both backends' servers take: tokenizer, address, sizes, parallelism, KV pool fraction."""
    s = slot.role.spec
    return [("--backend", backend), ("--tokenizer", str(served_tokenizer_dir(plan.request.model_dir))),
            ("--host", layout.host), ("--port", str(slot.port)), ("--max_batch_size", str(s.max_batch_size)),
            ("--max_num_tokens", str(s.max_num_tokens)), ("--max_seq_len", str(s.max_seq_len)),
            ("--max_beam_width", str(s.max_beam_width)), ("--tp_size", str(s.tp_size)), ("--pp_size", str(s.pp_size)),
            ("--kv_cache_free_gpu_memory_fraction", f"{s.kv_cache_free_gpu_mem_fraction:g}")]


def worker_commands(plan: BuildPlan, world: RankLayout, layout: ServeLayout, options_dir: str) -> list[WorkerCommand]:
    commands = []
    for slot in worker_slots(plan, world, layout):
        s = slot.role.spec
        args = server_args(plan, slot, layout, "tensorrt") + [
            ("--extra_llm_api_options", f"{options_dir}/{s.role}.yaml")]
        require_valid(check_args("trtllm-serve", args), f"trtllm-serve command for {s.role} {slot.index}")
        commands.append(WorkerCommand(s.role, slot.index, slot.port, slot.cuda_visible_devices, args,
                                      str(slot.role.engine_dir)))
    return commands


def router_config(workers: list[WorkerCommand], layout: ServeLayout) -> dict:
    config: dict = {"hostname": layout.host, "port": layout.router_port}
    for role, section in ROUTER_SECTION.items():
        urls = [f"{layout.host}:{w.port}" for w in workers if w.role == role]
        config[section] = {"num_instances": len(urls), "urls": urls}
    require_valid(check_keys("disagg-config", config), "disaggregated router config")
    return config


def yaml_text(header: list[str], data: dict) -> str:
    """`data` as YAML (keys in the order given) under `# ` comment lines."""
    lines = [f"# {h}" if h else "#" for h in header]
    return "\n".join(lines) + "\n" + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def render_serve_files(plan: BuildPlan, world: RankLayout, layout: ServeLayout, folder: str) -> dict[str, str]:
    """{relative path: text} for prefill.yaml, decode.yaml, disagg.yaml and launch.sh under `folder`."""
    r = plan.request
    stamp = f"Generated by trtpd {__version__} for TensorRT-LLM {PINNED.tensorrt_llm} (trtllm-serve --backend tensorrt)."
    files = {}
    for role in plan.roles:
        s = role.spec
        files[f"{folder}/{s.role}.yaml"] = yaml_text([
            f"extra_llm_api_options for the {s.role} servers of {r.model.name}. {stamp}",
            f"KV reuse is {'on' if s.enable_kv_cache_reuse else 'off'}"
            + (" (must be off on the context side: NVIDIA/TensorRT-LLM#12542)." if s.role == "prefill" else "."),
            f"max_tokens_in_buffer = longest prompt ({r.max_input_len} tokens) + one block: it must exceed the longest",
            "prompt (Dynamo's TensorRT-LLM known issues). kv_transfer_timeout_ms is enforced by the PyTorch backend's",
            "executor only (_torch/pyexecutor/py_executor.py); with --backend tensorrt, as here, TensorRT-LLM 1.2.1's",
            "C++ transceiver does not read it (trtpd lint: transfer-timeout-scope). KV dtype and tokens_per_block come",
            "from the engine, not from here.",
        ], role_llm_options(plan, role))
    workers = worker_commands(plan, world, layout, ".")
    files[f"{folder}/disagg.yaml"] = yaml_text([
        f"trtllm-serve disaggregated router for {r.model.name}. {stamp}",
        "num_instances must equal the number of urls in each section.",
    ], router_config(workers, layout))
    lines = ["#!/usr/bin/env bash", f"# trtllm-serve disaggregated deployment of {r.model.name}. {stamp}",
             f"# KV transfer: {r.transceiver_backend} (cache_transceiver_config in prefill.yaml/decode.yaml).",
             "set -euo pipefail", 'cd "$(dirname "$0")"', *guard_lines("launch.sh", "../" + TOKENIZER_DIR),
             *ucx_lines()]
    for w in workers:
        lines.append(w.shell(f"{w.role}-{w.index}.log"))
    lines.append(router_command_line())
    files[f"{folder}/launch.sh"] = "\n".join(lines) + "\n"
    return files


def ucx_lines() -> list[str]:
    """The launch script's UCX exports, each overridable from the environment."""
    require_valid(check_keys("env", UCX_ENV), "trtllm-serve launch environment")
    return ["# UCX for the KV transceiver (sources in trtpd/trtllm/serve_config.py UCX_ENV); on a multi-node NVLink",
            "# domain (GB200 NVL72) set UCX_CUDA_IPC_ENABLE_MNNVL=y instead."] + \
        [f"export {k}=${{{k}:-{v}}}" for k, v in UCX_ENV.items()]


def router_command_line() -> str:
    router = [("-c", "disagg.yaml"), ("-t", str(SERVER_START_TIMEOUT_S)), ("-r", "180")]
    require_valid(check_args("trtllm-serve disaggregated", router), "trtllm-serve disaggregated command")
    return "exec trtllm-serve disaggregated " + " ".join(f"{f} {v}" for f, v in router)

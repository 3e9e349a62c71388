"""A rendered Triton model repository (GPU or reference) and its MPI launch script.

Every repository: placeholders filled, config.pbtxt parses as ModelConfig, names equal folders.
Models on the `tensorrtllm` backend additionally: every parameter the 1.2.1 backend reads with no
fallback is present (options_table.BACKEND_PARAMETERS), KV reuse off on the context model,
participant_ids disjoint and sized TP*PP per instance, the MPI world = all participants + orchestrator
rank 0, and the decode engine takes the longest prompt (max_num_tokens, or chunked context).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from trtpd.schema.manifest import EngineManifest, load_manifest
from trtpd.errors import ConfigError
from trtpd.lint.backend_parameters import BACKEND_PARAMETERS
from trtpd.lint.findings import Finding
from trtpd.schema.id_groups import parse_id_groups
from trtpd.schema.pbtxt import parameters, parse_model_config

_PLACEHOLDER = re.compile(r"\$\{[^}]*\}")
_MPI_APP = re.compile(r"(?:^|\s)-n\s+(\d+)\s")


def lint_model_configs(configs: Mapping[str, str], *, root: str = "", launch_world_size: int | None = None,
                       launch_source: str = "launch script",
                       manifests: Mapping[str, EngineManifest] | None = None) -> list[Finding]:
    """`configs` maps folder name -> config.pbtxt text. `manifests` (folder -> manifest) stands in for
    the manifests at each role model's gpt_model_path, e.g. for engines that are only planned."""
    findings, parsed = [], {}
    for folder, text in sorted(configs.items()):
        source = f"{root}{folder}/config.pbtxt"
        left = sorted(set(_PLACEHOLDER.findall(text)))
        if left:
            findings.append(Finding("placeholders", "error", source, f"unfilled placeholder(s) {', '.join(left)}",
                                    "render the repository with trtpd (it fills every placeholder) or fill them"))
        try:
            config = parse_model_config(text, source)
        except ConfigError as exc:
            findings.append(Finding("model-config", "error", source, str(exc).split(": ", 1)[-1],
                                    "fix the syntax so it parses as Triton's ModelConfig"))
            continue
        if config.name and config.name != folder:
            findings.append(Finding("model-name-folder", "error", source,
                                    f"name {config.name!r} differs from its folder {folder!r}",
                                    f"set name: \"{folder}\" (Triton requires them equal)"))
        parsed[folder] = config
    role_models = {f: c for f, c in parsed.items() if c.backend == "tensorrtllm"}
    if role_models:
        found = {f: _manifest_at(parameters(c).get("gpt_model_path", "")) for f, c in role_models.items()}
        found.update(manifests or {})
        findings += _lint_role_models(parsed, role_models, root, launch_world_size, launch_source, found)
        findings += _lint_decode_num_tokens(parsed, role_models, root, found)
        findings.append(mpi_transfer_note(sorted(role_models)))
    return findings


def _manifest_at(engine_dir: str) -> EngineManifest | None:
    if not engine_dir:
        return None
    try:
        return load_manifest(Path(engine_dir))
    except ConfigError:
        return None


def mpi_transfer_note(models: list[str]) -> Finding:
    """What 1.2.1's Triton path cannot do, and what an operator does instead (trtllm-1.2.md §6; the sources of the
    timeout's scope and of the buffer variable are in trtpd/lint/serve_configs.py and trtpd/trtllm/transfer_buffer.py)."""
    return Finding(
        "mpi-transfer-limits", "info", ", ".join(models),
        "the tensorrtllm backend of TensorRT-LLM 1.2.1 hard-codes CacheTransceiverConfig(BackendType::MPI) "
        "(model_instance_state.cc getExecutorConfigFromParams): there is no KV-transfer timeout or transport "
        "setting, so a transfer to a stuck peer waits without bound and holds its KV blocks; the staging buffer "
        "is sized by the environment variable TRTLLM_KVCACHE_TRANSFER_BUFFER_SIZE (default 512MB, read on every "
        "transport; launch_triton.sh sets it to the longest prompt's KV per rank)",
        "when a rank dies, OpenMPI's mpirun terminates the whole world, so restart launch_triton.sh (all ranks, "
        "no single instance can rejoin); when a rank hangs instead, nothing frees the requests: give clients a "
        "deadline, watch nv_trt_llm_request_metrics{request_type=\"waiting\"} and the KV block metrics, and kill "
        "and restart the world; no compiled-engine path of 1.2.1 enforces kv_transfer_timeout_ms (trtllm-serve "
        "--backend tensorrt does not either; only its PyTorch backend does)")


def _longest_prompt(parsed, manifests, context: str) -> int | None:
    for config in parsed.values():
        value = parameters(config).get("max_input_len")
        if value and value.isdigit():
            return int(value)
    prefill = manifests.get(context)
    return prefill.build_config.max_input_len if prefill is not None else None


def _lint_decode_num_tokens(parsed, role_models, root, manifests) -> list[Finding]:
    """maxInputLen = min(max_seq_len - 1, max_num_tokens) without chunked context (trtGptModel.h), and
    LlmRequest::validate rejects longer prompts, generation-only requests included (trtllm-1.2.md §6)."""
    context = _context_model(parsed)
    prompt = _longest_prompt(parsed, manifests, context)
    findings = []
    for folder in sorted(role_models):
        manifest = manifests.get(folder)
        if folder == context or manifest is None or prompt is None:
            continue
        params = parameters(role_models[folder])
        chunked = params.get("enable_chunked_context", "false").lower() == "true"
        num_tokens = manifest.build_config.max_num_tokens
        if num_tokens < prompt and not chunked:
            findings.append(Finding(
                "decode-num-tokens", "error", f"{root}{folder}/config.pbtxt: enable_chunked_context",
                f"the engine's max_num_tokens is {num_tokens} but prompts reach {prompt} tokens and chunked context "
                f"is off, so the runtime caps input at {num_tokens} and rejects every longer generation-only request",
                f"set enable_chunked_context to \"true\" (the engine has paged context FMHA), or rebuild {folder} "
                f"with max_num_tokens >= {prompt}"))
    return findings


def lint_backend_parameters(folder: str, source: str, params: Mapping[str, str]) -> list[Finding]:
    """A missing no-fallback key makes GetParameter throw and every instance (worker ranks too) fail to load."""
    return [Finding("backend-parameters", "error", f"{source}: {p.name}",
                    f"model {folder!r} lacks parameter {p.name!r}, which the 1.2.1 tensorrtllm backend reads with no "
                    f"fallback ({p.reader}); the model fails to load with 'Cannot find parameter with name: {p.name}'",
                    f"add parameters: {{ key: \"{p.name}\" value: {{ string_value: \"\" }} }} (empty when unused, as "
                    f"upstream's template has it), or render the repository with trtpd")
            for p in BACKEND_PARAMETERS if not p.has_fallback and p.name not in params]


def _context_model(parsed) -> str:
    for config in parsed.values():
        name = parameters(config).get("context_model_name")
        if name:
            return name
    return "prefill"


def _lint_role_models(parsed, role_models, root, launch_world_size, launch_source, manifests) -> list[Finding]:
    findings, owner = [], {}
    context = _context_model(parsed)
    for folder, config in sorted(role_models.items()):
        source = f"{root}{folder}/config.pbtxt"
        params = parameters(config)
        findings += lint_backend_parameters(folder, source, params)
        if folder == context and params.get("enable_kv_cache_reuse", "true").lower() != "false":
            findings.append(Finding("context-kv-reuse", "error", f"{source}: enable_kv_cache_reuse",
                                    f"{params.get('enable_kv_cache_reuse', 'unset (the backend defaults to true)')} "
                                    f"on the context model; reuse can evict a block before it is sent and the "
                                    f"generation side hangs (NVIDIA/TensorRT-LLM#12542)",
                                    "set enable_kv_cache_reuse to \"false\""))
        if params.get("max_beam_width", "1") != "1":
            findings.append(Finding("beam-width", "error", f"{source}: max_beam_width",
                                    f"{params['max_beam_width']}; disaggregated serving supports 1 only",
                                    "set max_beam_width to \"1\""))
        try:
            groups = parse_id_groups(params.get("participant_ids", ""), f"{source}: participant_ids")
        except ConfigError as exc:
            findings.append(Finding("participant-ids", "error", f"{source}: participant_ids", str(exc).split(": ")[-1],
                                    "list the MPI ranks of each instance, e.g. \"1,2;3,4\" (mandatory in "
                                    "orchestrator mode with spawning disabled)"))
            continue
        findings += _check_groups(folder, source, config, params, groups, manifests.get(folder))
        for rank in (r for g in groups for r in g):
            if rank == 0:
                findings.append(Finding("participant-ids", "error", f"{source}: participant_ids",
                                        "rank 0 is the orchestrator and cannot run an engine",
                                        "number engine ranks from 1"))
            elif rank in owner:
                findings.append(Finding("participant-ids", "error", f"{source}: participant_ids",
                                        f"rank {rank} is also used by {owner[rank]}",
                                        "give every model its own MPI ranks (participant ids must not intersect)"))
            owner.setdefault(rank, folder)
    findings += _check_world(sorted(owner), launch_world_size, launch_source)
    return findings


def _check_groups(folder, source, config, params, groups, manifest) -> list[Finding]:
    findings = []
    count = sum(g.count for g in config.instance_group) or 1
    if count != len(groups):
        findings.append(Finding("participant-ids", "error", f"{source}: participant_ids",
                                f"{len(groups)} group(s) for instance_group count {count}",
                                "give one ';'-separated group of ranks per instance"))
    engine_dir = Path(params.get("gpt_model_path", ""))
    if manifest is not None:
        size = manifest.build_config.tp_size * manifest.build_config.pp_size
        bad = [g for g in groups if len(g) != size]
        if bad:
            findings.append(Finding("participant-ids", "error", f"{source}: participant_ids",
                                    f"group(s) {bad} do not have TP*PP = {size} ranks of engine {engine_dir.name}",
                                    f"give each instance {size} ranks"))
    return findings


def _check_world(ranks: list[int], launch_world_size: int | None, launch_source: str) -> list[Finding]:
    findings = []
    expected = len(ranks) + 1
    if ranks and ranks != list(range(1, expected)):
        findings.append(Finding("mpi-world", "error", "participant_ids",
                                f"engine ranks {ranks} are not exactly 1..{expected - 1}",
                                "number the engine ranks 1, 2, ... without gaps (rank 0 is the orchestrator)"))
    if launch_world_size is not None and launch_world_size != expected:
        findings.append(Finding("mpi-world", "error", launch_source,
                                f"mpirun starts {launch_world_size} rank(s) but the models need {expected} "
                                f"({len(ranks)} engine ranks + 1 orchestrator)",
                                f"launch {expected} ranks (world_size = context TP*PP + generation TP*PP + 1)"))
    return findings


def launch_world_size(script_text: str) -> int | None:
    """Sum of `-n K` over the mpirun app contexts of a launch script, or None if it runs no mpirun."""
    if "mpirun" not in script_text:
        return None
    body = script_text.replace("\\\n", " ")
    return sum(int(n) for n in _MPI_APP.findall(body + " "))


def lint_repository(path: Path, *, launch_script: Path | None = None) -> list[Finding]:
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{path}: no such model repository")
    configs = {d.name: (d / "config.pbtxt").read_text() for d in sorted(path.iterdir())
               if (d / "config.pbtxt").is_file()}
    if not configs:
        raise ConfigError(f"{path}: no model folder with a config.pbtxt; is this a Triton model repository?")
    world = launch_world_size(launch_script.read_text()) if launch_script and launch_script.is_file() else None
    return lint_model_configs(configs, root=f"{path}/", launch_world_size=world,
                              launch_source=str(launch_script) if launch_script else "launch script")

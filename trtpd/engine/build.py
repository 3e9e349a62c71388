"""`trtpd build --backend reference`: deterministic reference weights and role-tuned engine folders.

Layout (the reference analogue of checkpoint -> trtllm-build per role):
    <engines_dir>/<model>/reference-<kv_dtype>/checkpoint/   weights, tokenizer, KV calibration
    <engines_dir>/<model>/reference-<kv_dtype>/<role>-tp1/   config.json + manifest.json per role
Rebuilding with the same inputs is skipped (the manifest records them); `force` rebuilds.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from trtpd import __version__
from trtpd.catalog import KvDtype, get_model
from trtpd.engine import corpus
from trtpd.engine.checkpoint import TOKENIZER_FILE, WEIGHTS_FILE, write_checkpoint
from trtpd.engine.engine_config import EngineConfig, Role, role_defaults
from trtpd.engine.model import FP8_MAX, LlamaModel, init_weights
from trtpd.engine.tokenizer import Tokenizer
from trtpd.errors import ConfigError

MAX_REFERENCE_PARAMS = 200_000_000
ENGINE_FORMAT = 2   # bump when the engine folder's contents change, so old builds are rebuilt
ROLES = (Role.PREFILL, Role.DECODE, Role.COLOCATED)
Progress = Callable[[str], None]


def build_root(engines_dir: Path, model: str, kv_dtype: KvDtype | str) -> Path:
    return Path(engines_dir) / model / f"reference-{KvDtype.parse(kv_dtype).value}"


def engine_dir(engines_dir: Path, model: str, kv_dtype: KvDtype | str, role: Role | str) -> Path:
    return build_root(engines_dir, model, kv_dtype) / f"{Role(role).value}-tp1"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def build_reference(model: str, engines_dir: Path, *, kv_dtype: str = "fp16", tokens_per_block: int = 32,
                    max_input_len: int = 2048, max_output_len: int = 512, force: bool = False,
                    seed: int = 0, progress: Progress | None = None) -> list[Path]:
    """Builds the checkpoint and the prefill, decode and colocated engine folders; returns the engine folders."""
    say = progress or (lambda msg: None)
    spec = get_model(model)
    if spec.num_params > MAX_REFERENCE_PARAMS:
        raise ConfigError(f"model {model!r} has {spec.num_params / 1e9:.1f}B parameters; the reference backend runs "
                          f"on the CPU with random weights, use tiny-llama (or --backend tensorrtllm for real engines)")
    dtype = KvDtype.parse(kv_dtype)
    if max_input_len + max_output_len > spec.max_position_embeddings:
        raise ConfigError(f"max_input_len + max_output_len ({max_input_len + max_output_len}) exceeds {model}'s "
                          f"max_position_embeddings ({spec.max_position_embeddings}); lower --max-input-len or --max-output-len")
    root = build_root(engines_dir, model, dtype)
    inputs = {"model": model, "kv_dtype": dtype.value, "tokens_per_block": tokens_per_block,
              "max_input_len": max_input_len, "max_output_len": max_output_len, "seed": seed,
              "engine_format": ENGINE_FORMAT}
    dirs = [root / f"{role.value}-tp1" for role in ROLES]
    if not force and all(_manifest_matches(d, inputs) for d in dirs):
        say(f"up to date: {root} (inputs unchanged; pass --force to rebuild)")
        return dirs
    configs = {}
    for role in ROLES:  # validate every engine config before writing anything
        try:
            configs[role] = EngineConfig(model=model, role=role, kv_dtype=dtype, tokens_per_block=tokens_per_block,
                                         max_input_len=max_input_len, max_seq_len=max_input_len + max_output_len,
                                         **role_defaults(role, max_input_len, max_output_len, tokens_per_block))
        except ValueError as exc:
            raise ConfigError(f"cannot build {model} {role.value} engine: {exc}") from None
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    staging.chmod(0o755)
    try:
        started = time.perf_counter()
        say(f"[1/3] weights: {spec.num_params / 1e6:.1f}M parameters, seed {seed}")
        weights = init_weights(spec, seed)
        say(f"[2/3] tokenizer: byte-fallback BPE, vocab {spec.vocab_size}")
        tokenizer = Tokenizer.train(corpus.training_corpus(), spec.vocab_size)
        k_scales, v_scales = _kv_scales(spec, weights, tokenizer, dtype)
        write_checkpoint(staging / "checkpoint", spec, weights, tokenizer, dtype, k_scales, v_scales, seed)
        say(f"[3/3] engines: {', '.join(r.value for r in ROLES)} (kv {dtype.value}, tokens_per_block {tokens_per_block})")
        checksums = {name: _sha256(staging / "checkpoint" / name) for name in (WEIGHTS_FILE, TOKENIZER_FILE)}
        for role, config in configs.items():
            out = staging / f"{role.value}-tp1"
            out.mkdir()
            config.save(out)
            _write_manifest(out, config, inputs, checksums, time.perf_counter() - started)
        if root.exists():
            shutil.rmtree(root)
        staging.rename(root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    say(f"built {root}")
    return dirs


def _kv_scales(spec, weights, tokenizer: Tokenizer, dtype: KvDtype) -> tuple[list[float], list[float]]:
    if dtype is not KvDtype.FP8:
        return [1.0] * spec.num_layers, [1.0] * spec.num_layers
    model = LlamaModel(spec, weights, [1.0] * spec.num_layers, [1.0] * spec.num_layers)
    k_amax = [0.0] * spec.num_layers
    v_amax = [0.0] * spec.num_layers
    with torch.no_grad():
        for seed in range(4):  # calibration set: 4 prompts of ~512 tokens
            ids = tokenizer.encode(corpus.text(40, seed=10_000 + seed))[:512]
            k, v = model.kv_amax(ids)
            k_amax = [max(a, b) for a, b in zip(k_amax, k)]
            v_amax = [max(a, b) for a, b in zip(v_amax, v)]
    return [a / FP8_MAX for a in k_amax], [a / FP8_MAX for a in v_amax]


def _write_manifest(out: Path, config: EngineConfig, inputs: dict, checksums: dict, seconds: float) -> None:
    command = (f"trtpd build --backend reference --model {inputs['model']} --kv-dtype {inputs['kv_dtype']} "
               f"--tokens-per-block {inputs['tokens_per_block']} --max-input-len {inputs['max_input_len']} "
               f"--max-output-len {inputs['max_output_len']}")
    manifest = {
        "backend": "reference", "model": config.model, "role": config.role.value, "tp_size": 1, "pp_size": 1,
        "status": "built", "inputs": inputs, "commands": [command],
        "build_config": config.model_dump(mode="json"),
        "versions": {"trtpd": __version__, "torch": torch.__version__},
        "checksums": {"checkpoint/" + k: v for k, v in checksums.items()} | {"config.json": _sha256(out / "config.json")},
        "build_seconds": round(seconds, 3),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def _manifest_matches(engine_folder: Path, inputs: dict) -> bool:
    path = engine_folder / "manifest.json"
    if not path.is_file() or not (engine_folder / "config.json").is_file():
        return False
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError:
        return False
    return manifest.get("status") == "built" and manifest.get("inputs") == inputs

"""`trtpd build --backend reference`: deterministic reference weights and role-tuned engine folders.

Layout (the reference analogue of checkpoint -> trtllm-build per role):
    <engines_dir>/<model>/reference-<kv_dtype>/checkpoint/   weights, tokenizer, KV calibration
    <engines_dir>/<model>/reference-<kv_dtype>/<role>-tp1/   config.json + manifest.json per role
Rebuilding with the same inputs is skipped (the manifest records them); `force` rebuilds.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from trtpd import __version__
from trtpd.catalog import KvDtype, ModelSpec, get_model
from trtpd.engine import corpus
from trtpd.schema.manifest import (BuildInputs, EngineBuildConfig, EngineManifest, FileChecksum, ModelShape, StepRecord,
                                   load_manifest, now_iso, write_manifest)
from trtpd.engine.checkpoint import CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE, load_checkpoint, write_checkpoint
from trtpd.engine.engine_config import EngineConfig, Role, role_defaults
from trtpd.engine.model import FP8_MAX, LlamaModel, init_weights
from trtpd.engine.tokenizer import CONFIG_FILE as TOKENIZER_CONFIG_FILE
from trtpd.engine.tokenizer import Tokenizer
from trtpd.errors import ConfigError
from trtpd.staging import staged_folder

MAX_REFERENCE_PARAMS = 200_000_000
ENGINE_FORMAT = 3   # bump when the engine folder's contents change, so old builds are rebuilt
TOKENIZER_SCHEME = "hf-tokenizers-llama2-bpe-1"   # 3: a Hugging Face tokenizer.json (was trtpd's own BPE file)
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
              "tokenizer": TOKENIZER_SCHEME}
    dirs = [root / f"{role.value}-tp1" for role in ROLES]
    configs = {}
    for role in ROLES:  # validate every engine config before writing anything
        try:
            configs[role] = EngineConfig(model=model, role=role, kv_dtype=dtype, tokens_per_block=tokens_per_block,
                                         max_input_len=max_input_len, max_seq_len=max_input_len + max_output_len,
                                         **role_defaults(role, max_input_len, max_output_len, tokens_per_block))
        except ValueError as exc:
            raise ConfigError(f"cannot build {model} {role.value} engine: {exc}") from None
    if not force and all(_manifest_matches(root / f"{r.value}-tp1", _manifest(c, spec, inputs)) for r, c in configs.items()):
        say(f"up to date: {root} (inputs unchanged; pass --force to rebuild)")
        return dirs
    with staged_folder(root, overwrite=True) as staging:
        started = time.perf_counter()
        say(f"[1/3] weights: {spec.num_params / 1e6:.1f}M parameters, seed {seed}")
        weights = init_weights(spec, seed)
        say(f"[2/3] tokenizer: Llama-2-style byte-fallback BPE (Hugging Face tokenizers), vocab {spec.vocab_size}")
        tokenizer = Tokenizer.train(corpus.training_corpus(), spec.vocab_size)
        k_scales, v_scales = _kv_scales(spec, weights, tokenizer, dtype)
        write_checkpoint(staging / "checkpoint", spec, weights, tokenizer, dtype, k_scales, v_scales, seed)
        say(f"[3/3] engines: {', '.join(r.value for r in ROLES)} (kv {dtype.value}, tokens_per_block {tokens_per_block})")
        digest = load_checkpoint(staging / "checkpoint").layout(tokens_per_block).scales_digest
        checkpoint_files = [staging / "checkpoint" / n for n in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE,
                                                                  TOKENIZER_CONFIG_FILE)]
        for role, config in configs.items():
            out = staging / f"{role.value}-tp1"
            out.mkdir()
            config.save(out)
            sums = _checksums(out, [out / "config.json", *checkpoint_files])
            write_manifest(_manifest(config, spec, inputs, digest, sums, time.perf_counter() - started), out)
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


def _manifest(config: EngineConfig, spec: ModelSpec, inputs: dict, scales_digest: str | None = None,
              checksums: list[FileChecksum] | None = None, seconds: float | None = None) -> EngineManifest:
    """The engine's manifest in the schema both backends share (trtpd/schema/manifest.py)."""
    argv = ["trtpd", "build", "--backend", "reference", "--model", inputs["model"], "--kv-dtype", inputs["kv_dtype"],
            "--tokens-per-block", str(inputs["tokens_per_block"]), "--max-input-len", str(inputs["max_input_len"]),
            "--max-output-len", str(inputs["max_output_len"]), "--seed", str(inputs["seed"])]
    done = checksums is not None
    return EngineManifest(
        backend="reference", role=config.role.value, model=ModelShape.of(spec),
        build_config=EngineBuildConfig(
            kv_dtype=config.kv_dtype, tokens_per_block=config.tokens_per_block, max_batch_size=config.max_batch_size,
            max_num_tokens=config.max_num_tokens, max_input_len=config.max_input_len, max_seq_len=config.max_seq_len,
            max_beam_width=config.max_beam_width, tp_size=1, pp_size=1),
        inputs=BuildInputs(model_source=inputs["model"], checkpoint_dir=config.checkpoint_dir, weights_dtype="float32",
                           kv_cache_quant_algo="FP8" if config.kv_dtype is KvDtype.FP8 else "none"),
        kv_scales_digest=scales_digest,
        steps=[StepRecord(name="reference-build", argv=argv, output_dir=".", status="ok" if done else "planned",
                          duration_s=None if seconds is None else round(seconds, 3))],
        versions={"trtpd": __version__, "torch": torch.__version__, "engine_format": str(ENGINE_FORMAT)},
        checksums=checksums or [], status="complete" if done else "planned", updated_at=now_iso() if done else None)


def _checksums(engine_folder: Path, files: list[Path]) -> list[FileChecksum]:
    return [FileChecksum(path=os.path.relpath(f, engine_folder), sha256=_sha256(f), size_bytes=f.stat().st_size)
            for f in files]


def _manifest_matches(engine_folder: Path, expected: EngineManifest) -> bool:
    if not (engine_folder / "config.json").is_file():
        return False
    try:
        existing = load_manifest(engine_folder)
    except ConfigError:
        return False
    return existing.status == "complete" and existing.inputs_digest() == expected.inputs_digest()

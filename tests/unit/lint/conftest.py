"""Factories for lint tests: a compatible prefill/decode pair, serve configs and a GPU repository."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtpd.trtllm.deploy import plan_deploy, write_deploy
from trtpd.schema.manifest import BuildInputs, EngineBuildConfig, EngineManifest, ModelShape
from trtpd.trtllm.plan import plan_build
from trtpd.trtllm.recipe import load_recipes
from trtpd.trtllm.spec import BuildOverrides, make_request
from trtpd.catalog import get_model


def manifest(role: str = "prefill", *, model: str = "llama-2-70b", status: str = "complete",
             scales: str | None = None, shape: dict | None = None, checkpoint: str | None = None,
             **build) -> EngineManifest:
    config = {"kv_dtype": "fp8", "tokens_per_block": 32, "max_batch_size": 4 if role == "prefill" else 256,
              "max_num_tokens": 8192 if role == "prefill" else 256, "max_input_len": 2048, "max_seq_len": 2560,
              "max_beam_width": 1, "tp_size": 4, "pp_size": 1, **build}
    model_shape = ModelShape.of(get_model(model)).model_copy(update=shape or {})
    return EngineManifest(backend="tensorrtllm", role=role, model=model_shape,
                          build_config=EngineBuildConfig(**config),
                          inputs=BuildInputs(model_source=model, checkpoint_dir=checkpoint),
                          kv_scales_digest=scales, status=status)


def serve_options(role: str = "prefill", **ctc) -> dict:
    return {"kv_cache_config": {"enable_block_reuse": False, "free_gpu_memory_fraction": 0.85},
            "cache_transceiver_config": {"backend": "UCX", "max_tokens_in_buffer": 2080,
                                         "kv_transfer_timeout_ms": 60000, **ctc}}


def router(ctx_urls=("localhost:8100",), gen_urls=("localhost:8101",), **sections) -> dict:
    config = {"hostname": "localhost", "port": 8000,
              "context_servers": {"num_instances": len(ctx_urls), "urls": list(ctx_urls)},
              "generation_servers": {"num_instances": len(gen_urls), "urls": list(gen_urls)}}
    for key, value in sections.items():
        config[key].update(value)
    return config


CLUSTER = {"cluster_uri": "http://localhost:8000", "cluster_name": "trtpd-llama-2-70b", "heartbeat_interval_sec": 5,
           "inactive_timeout_sec": 10}


def pytorch_options(role: str = "prefill", *, cluster: dict | None = None, kv: dict | None = None, **keys) -> dict:
    """A PyTorch-backend server's YAML as serve-pytorch/ writes it; keyword arguments replace top-level keys."""
    options = serve_options(role)
    options["kv_cache_config"].update({"tokens_per_block": 32, "dtype": "fp8", **(kv or {})})
    options.update({"disable_overlap_scheduler": role == "prefill", "enable_iter_perf_stats": True,
                    "disagg_cluster": {**CLUSTER, **(cluster or {})}, **keys})
    return options


def cluster_router(minimal: dict | None = None, **cluster) -> dict:
    """A router that takes registrations (disagg_cluster) instead of static urls."""
    return {"hostname": "localhost", "port": 8000,
            "disagg_cluster": {**CLUSTER, "minimal_instances": {"context_servers": 1, "generation_servers": 1,
                                                                 **(minimal or {})}, **cluster}}


@pytest.fixture(scope="session")
def gpu_deploy(tmp_path_factory) -> Path:
    """A rendered GPU deploy folder for llama-2-70b TP2 prefill / TP4 decode (engines not built)."""
    root = tmp_path_factory.mktemp("engines")
    request = make_request("llama-2-70b", load_recipes(), BuildOverrides(prefill_tp=2, decode_tp=4), engines_dir=root)
    return write_deploy(plan_deploy(plan_build(request)))


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


@pytest.fixture
def make():
    """The factories above, for test modules (conftest is not importable under --import-mode=importlib)."""
    class Factories:
        pass
    f = Factories()
    f.manifest, f.serve_options, f.router, f.edit = manifest, serve_options, router, edit
    f.pytorch_options, f.cluster_router = pytorch_options, cluster_router
    return f

"""Everything a GPU deployment needs next to the engines, planned as data and written all-or-nothing.

`engines/<model>/deploy/` holds:
  model_repository/   ensemble, preprocessing, postprocessing, disagg_bls (shared templates) and
                      prefill, decode (tensorrtllm backend)
  launch_triton.sh    one MPI world (orchestrator + context + generation ranks)
  trtllm-serve/       prefill.yaml, decode.yaml, disagg.yaml, launch.sh (the engines behind trtllm-serve, UCX/NIXL)
  serve-pytorch/      the same servers on TensorRT-LLM's PyTorch backend, no engine: checkpoint.sh (FP8: ModelOpt's
                      hf_ptq.py), prefill.yaml, decode.yaml, disagg.yaml (disagg_cluster), launch.sh; always written,
                      why: serve_pytorch.py
  containers/         docker run lines and compose files for both paths (build/container_launch.py)
  tokenizer/          the tokenizer files every server reads (tokenizer_files.py): copied from
                      --tokenizer-dir, the model folder or the local Hugging Face cache; never a hub id
  python/trtpd/       a copy of trtpd's source for the python models, which import trtpd.serving.*:
                      the containers ship without trtpd; launch_triton.sh installs it as one .pth
                      file in the site-packages of the python3 on PATH (the python-backend stub
                      ignores PYTHONPATH), with no pip and no network (launch.install_python_package_lines)
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import trtpd
from trtpd.trtllm.container_launch import render_container_files
from trtpd.trtllm.containers import CONTAINERS, DEFAULT_CONTAINER, ContainerLayout
from trtpd.trtllm.gpu_repo import plan_role_models
from trtpd.trtllm.launch import PYTHON_DIR, TritonPorts, render_triton_launch
from trtpd.trtllm.mpi_world import RankLayout, plan_mpi_world
from trtpd.trtllm.plan import BuildPlan
from trtpd.trtllm.serve_config import ServeLayout, render_serve_files, worker_commands
from trtpd.trtllm.serve_pytorch import render_pytorch_serve_files
from trtpd.trtllm.tokenizer_files import TOKENIZER_DIR, copy_tokenizer, served_tokenizer_dir, tokenizer_source
from trtpd.errors import ConfigError
from trtpd.staging import staged_folder
from trtpd.repo.render import ModelPlan, render_repository, templates_dir

SHARED_TEMPLATES = ("ensemble", "preprocessing", "postprocessing", "disagg_bls")
REPO_DIR = "model_repository"
TRITON_LAUNCH = "launch_triton.sh"
SERVE_DIR = "trtllm-serve"
SERVE_PYTORCH_DIR = "serve-pytorch"


@dataclass(frozen=True)
class DeployPlan:
    deploy_dir: Path
    world: RankLayout
    models: list[ModelPlan]
    files: dict[str, str] = field(default_factory=dict)     # relative to deploy_dir
    container: ContainerLayout = CONTAINERS[DEFAULT_CONTAINER]
    tokenizer_source: str = ""          # folder or hub id whose tokenizer files go to tokenizer/

    @property
    def repo_dir(self) -> Path:
        return self.deploy_dir / REPO_DIR


def shared_model_plans(plan: BuildPlan, tokenizer_dir: str) -> list[ModelPlan]:
    """ensemble -> preprocessing -> disagg_bls (prefill, then decode) -> postprocessing."""
    r = plan.request
    batch = max(r.prefill.max_batch_size, r.decode.max_batch_size)
    return [
        ModelPlan("preprocessing", "preprocessing", {"instance_count": 1, "max_batch_size": batch,
                                                     "max_input_len": r.max_input_len,
                                                     "max_output_len": r.max_output_len,
                                                     "tokenizer_dir": tokenizer_dir}),
        ModelPlan("postprocessing", "postprocessing", {"instance_count": 1, "max_batch_size": batch,
                                                       "tokenizer_dir": tokenizer_dir}),
        ModelPlan("disagg_bls", "disagg_bls", {"instance_count": 1, "max_batch_size": batch, "mode": "disaggregated",
                                               "context_model_name": "prefill", "generation_model_name": "decode",
                                               # TensorRT-LLM: handle after prefill, no trtpd timing outputs
                                               "kv_transfer": "after_prefill", "perf_outputs": "", "kv_key_file": "", "fleet_file": "",
                                               "colocated_model_name": "none"}),
        ModelPlan("ensemble", "ensemble", {"max_batch_size": batch, "bls_model": "disagg_bls",
                                           "preprocessing_model": "preprocessing",
                                           "postprocessing_model": "postprocessing"}),
    ]


def missing_shared_templates(templates: Path | None = None) -> list[str]:
    templates = templates or templates_dir()
    return [t for t in SHARED_TEMPLATES if not (templates / t / "config.pbtxt.tmpl").is_file()]


def plan_gpu_repository(plan: BuildPlan, world: RankLayout, tokenizer_dir: str,
                        templates: Path | None = None) -> list[ModelPlan]:
    """The full GPU repository: shared templates plus the tensorrtllm `prefill` and `decode`."""
    missing = missing_shared_templates(templates)
    if missing:
        raise ConfigError(f"triton_models/ lacks the shared template(s) {', '.join(missing)}; "
                          f"only plan_role_models() can be rendered without them")
    return shared_model_plans(plan, tokenizer_dir) + plan_role_models(plan, world)


def plan_deploy(plan: BuildPlan, *, tokenizer_dir: str | None = None, triton_ports: TritonPorts = TritonPorts(),
                serve_layout: ServeLayout = ServeLayout(), templates: Path | None = None,
                container: ContainerLayout = CONTAINERS[DEFAULT_CONTAINER]) -> DeployPlan:
    """`tokenizer_dir`: where the tokenizer files come from (default: the model source); the configs name the
    deploy folder's copy, tokenizer/, which write_deploy fills."""
    r = plan.request
    deploy_dir = r.model_dir / "deploy"
    world = plan_mpi_world(r)
    served = served_tokenizer_dir(r.model_dir)
    models = plan_gpu_repository(plan, world, str(served), templates)
    files = {TRITON_LAUNCH: render_triton_launch(plan, world, deploy_dir / REPO_DIR, triton_ports)}
    files.update(render_serve_files(plan, world, serve_layout, SERVE_DIR))
    files.update(render_pytorch_serve_files(plan, world, serve_layout, SERVE_PYTORCH_DIR))
    files.update(render_container_files(plan, world, container, deploy_dir, triton_ports, serve_layout,
                                        worker_commands(plan, world, serve_layout, ".")))
    return DeployPlan(deploy_dir, world, models, files, container, tokenizer_dir or r.model_source)


def write_python_package(target: Path) -> Path:
    """Copies trtpd's python source (no caches, no tests) to target/trtpd for the python models."""
    source = Path(trtpd.__file__).resolve().parent
    dest = target / "trtpd"
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def write_deploy(deploy: DeployPlan, *, force: bool = False, templates: Path | None = None,
                 require_tokenizer: bool = False) -> Path:
    """Writes the deploy folder; on any error nothing is left behind (an old folder stays as it was). The tokenizer
    is copied when a local one is found; without one the launch scripts stop at start, naming the fix, and
    `require_tokenizer` (a real build, whose quantize/convert step filled the Hugging Face cache) refuses instead."""
    target = deploy.deploy_dir
    with staged_folder(target, overwrite=force) as staging:
        render_repository(deploy.models, staging / REPO_DIR, templates=templates, overwrite=True)
        write_python_package(staging / PYTHON_DIR)
        if require_tokenizer or tokenizer_source(deploy.tokenizer_source)[0] is not None:
            copy_tokenizer(deploy.tokenizer_source, staging / TOKENIZER_DIR)
        for rel, text in deploy.files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if rel.endswith(".sh"):
                path.chmod(0o755)
    return target

"""One Triton MPI world for any instance counts, rendered beside the build's own (blue/green).

On the tensorrt-llm (Triton) target a world is the unit of deployment (mpi_world.py): new counts mean a new
world. `render_world` writes one into a folder of its own from a finished `trtpd build`:
  model_repository/   the build's repository; `prefill` and `decode` re-rendered for the new RankLayout
                      (participant_ids, gpu_device_ids 0..k-1 local to CUDA_VISIBLE_DEVICES, instance count),
                      every other model copied as the build wrote it
  launch_world.sh     the build's launch_triton.sh (launch.render_triton_launch) for the new layout and ports,
                      CUDA_VISIBLE_DEVICES set, DEPLOY_DIR the build's deploy folder (python/, tokenizer/)

The role models are rendered by the build's own renderer (gpu_repo.plan_role_models) from a BuildPlan recovered
from the engines' manifests and the recipes. The manifests hold every compiled size but not the recipe-only
runtime settings (KV fraction, scheduler policy, CUDA graphs, queue limits), so before writing anything the
recovered plan re-renders the build's own layout and must give the build's role configs byte for byte; a build
made with other recipes (or older ones) is refused, naming the file and the first line that differs.
"""

from __future__ import annotations

import shutil
from itertools import zip_longest
from dataclasses import dataclass
from pathlib import Path

from trtpd.catalog import model_names
from trtpd.errors import ConfigError
from trtpd.repo.render import render_repository
from trtpd.schema.id_groups import parse_id_groups
from trtpd.schema.manifest import EngineManifest, load_manifest
from trtpd.schema.pbtxt import load_model_config, parameters
from trtpd.staging import staged_folder
from trtpd.trtllm.check import preview_repository
from trtpd.trtllm.deploy import REPO_DIR, TRITON_LAUNCH, DeployPlan
from trtpd.trtllm.gpu_repo import plan_role_models
from trtpd.trtllm.launch import TritonPorts, render_triton_launch
from trtpd.trtllm.mpi_world import RankLayout, plan_mpi_world
from trtpd.trtllm.plan import BuildPlan, plan_build
from trtpd.trtllm.recipe import ROLES, load_recipes
from trtpd.trtllm.spec import BuildOverrides, make_request

WORLD_LAUNCH = "launch_world.sh"


@dataclass(frozen=True)
class WorldLaunch:
    folder: Path                    # the world's own folder
    repo: Path                      # its model_repository
    script: Path                    # its launch script, executable
    layout: RankLayout
    gpus_needed: int                # sum over instances of tp*pp
    cuda_visible_devices: str


@dataclass(frozen=True)
class BuiltDeploy:
    """What a finished tensorrt-llm build left in its deploy folder, per role."""

    deploy_dir: Path
    manifests: dict[str, EngineManifest]
    counts: dict[str, int]          # the build's own instance counts (its participant groups)

    def gpus_per_instance(self, role: str) -> int:
        b = self.manifests[role].build_config
        return b.tp_size * b.pp_size

    def gpus_needed(self, counts: dict[str, int]) -> int:
        return sum(counts[role] * self.gpus_per_instance(role) for role in ROLES)


def read_build(deploy_dir: Path) -> BuiltDeploy:
    """The manifests of the engines this deploy folder serves; ConfigError unless it is a finished build."""
    deploy_dir = Path(deploy_dir).resolve()
    missing = [p for p in [deploy_dir / TRITON_LAUNCH, *(deploy_dir / REPO_DIR / r / "config.pbtxt" for r in ROLES)]
               if not p.is_file()]
    if missing:
        raise ConfigError(f"{deploy_dir}: not a tensorrt-llm deploy folder ({', '.join(map(str, missing))} missing); "
                          f"run trtpd build --backend tensorrt-llm first")
    manifests, counts = {}, {}
    for role in ROLES:
        manifests[role], counts[role] = _read_role(deploy_dir / REPO_DIR / role / "config.pbtxt", role)
    return BuiltDeploy(deploy_dir, manifests, counts)


def _read_role(config_path: Path, role: str) -> tuple[EngineManifest, int]:
    """Per-instance GPUs come from the engine's manifest (tp_size * pp_size): the engine is compiled for exactly
    that many ranks (quantize.py --tp_size/--pp_size, trtllm-build --workers), and the role config's participant
    groups are only what the build derived from it. The manifest is the one at the config's gpt_model_path, so it
    is the engine this deploy folder serves even where the model folder holds engines of several TPs; the groups
    must agree with it."""
    params = parameters(load_model_config(config_path))
    manifest = load_manifest(Path(params["gpt_model_path"]))
    if manifest.backend != "tensorrtllm" or manifest.status != "complete" or manifest.role != role:
        raise ConfigError(f"{params['gpt_model_path']}: the engine {config_path} serves is backend "
                          f"{manifest.backend}, role {manifest.role}, status {manifest.status}; a world needs a "
                          f"finished tensorrtllm {role} engine (run trtpd build without --configs-only)")
    groups = parse_id_groups(params["participant_ids"], f"{config_path} participant_ids")
    b = manifest.build_config
    if any(len(g) != b.tp_size * b.pp_size for g in groups):
        raise ConfigError(f"{config_path}: participant_ids {params['participant_ids']!r} are not groups of "
                          f"TP{b.tp_size}*PP{b.pp_size} = {b.tp_size * b.pp_size} ranks as its engine's manifest "
                          f"says; rerun trtpd build --configs-only --force")
    return manifest, len(groups)


def require_counts(counts: dict[str, int]) -> None:
    if sorted(counts) != sorted(ROLES) or any(not isinstance(n, int) or n < 1 for n in counts.values()):
        raise ConfigError(f"instance counts {counts}: need prefill and decode, each at least 1")


def world_gpus(deploy_dir: Path, counts: dict[str, int]) -> int:
    """GPUs a world with these counts needs: sum over roles of count x the engine's tp_size * pp_size."""
    require_counts(counts)
    return read_build(deploy_dir).gpus_needed(counts)


def recover_plan(build: BuiltDeploy, counts: dict[str, int], *, recipes: Path | None = None) -> BuildPlan:
    """The build's plan with `counts` instances: compiled sizes from the manifests, the rest from the recipes."""
    p = build.manifests["prefill"]
    overrides = BuildOverrides.of_engines(p, build.manifests["decode"], prefill_instances=counts["prefill"],
                                          decode_instances=counts["decode"])
    model = p.model.name if p.model.name in model_names() else p.inputs.model_source
    # gpus_per_node only bounds the layout in make_request; a world's GPUs are the ones it is given
    request = make_request(model, load_recipes(recipes), overrides, engines_dir=build.deploy_dir.parent.parent,
                           hf_model=p.inputs.model_source, gpus_per_node=build.gpus_needed(counts))
    if request.model_dir / "deploy" != build.deploy_dir:
        raise ConfigError(f"{build.deploy_dir}: its manifests name model {p.model.name}, whose deploy folder would be "
                          f"{request.model_dir / 'deploy'}; render a world from the folder trtpd build wrote")
    return plan_build(request)


def require_faithful(build: BuiltDeploy, recipes: Path | None) -> None:
    """The recovered plan, at the build's own counts, must render the build's role configs exactly."""
    plan = recover_plan(build, build.counts, recipes=recipes)
    world = plan_mpi_world(plan.request)
    rendered = preview_repository(DeployPlan(build.deploy_dir, world, plan_role_models(plan, world)))
    for role, text in rendered.items():
        path = build.deploy_dir / REPO_DIR / role / "config.pbtxt"
        for number, (built, ours) in enumerate(zip_longest(path.read_text().splitlines(), text.splitlines()), 1):
            if built != ours:
                raise ConfigError(f"{path}:{number}: {built!r} where the recipes {recipes or 'installed with trtpd'} "
                                  f"render {ours!r} for this build, so a world rendered from them would differ from "
                                  f"it; pass the recipes it was built with, or rerun trtpd build --configs-only --force")


def render_world(deploy_dir: Path, counts: dict[str, int], gpu_ids: tuple[int, ...], out_dir: Path,
                 ports: TritonPorts, *, recipes: Path | None = None) -> WorldLaunch:
    """Writes out_dir (all or nothing) and returns how to launch it. An existing out_dir is refused: a running
    world may be serving from it."""
    require_counts(counts)
    out_dir = Path(out_dir).resolve()
    if out_dir.exists():
        raise ConfigError(f"{out_dir} already exists; a world is rendered into a new folder (remove this one once "
                          f"no world runs from it)")
    build = read_build(deploy_dir)
    needed = build.gpus_needed(counts)
    if len(set(gpu_ids)) != len(gpu_ids) or any(g < 0 for g in gpu_ids):
        raise ConfigError(f"GPU ids {gpu_ids}: each must be a distinct device number, 0 or more")
    if len(gpu_ids) != needed:
        terms = " + ".join(f"{counts[r]} x {r} {build.gpus_per_instance(r)} GPU(s)" for r in ROLES)
        raise ConfigError(f"a world of {terms} needs {needed} GPUs; got {len(gpu_ids)} ({gpu_ids})")
    require_faithful(build, recipes)
    plan = recover_plan(build, counts, recipes=recipes)
    layout = plan_mpi_world(plan.request)
    devices = ",".join(str(g) for g in gpu_ids)
    # its own python-backend shared-memory names, apart from the build's world's (prefix<rank>_) and other worlds'
    script = render_triton_launch(plan, layout, out_dir / REPO_DIR, ports, deploy_dir=build.deploy_dir,
                                  cuda_visible_devices=devices, shm_prefix=f"trtpd{ports.http_port}_rank")
    with staged_folder(out_dir) as staging:
        render_repository(plan_role_models(plan, layout), staging / REPO_DIR)
        for model in sorted((build.deploy_dir / REPO_DIR).iterdir()):
            if model.is_dir() and model.name not in ROLES:
                shutil.copytree(model, staging / REPO_DIR / model.name)
        (staging / WORLD_LAUNCH).write_text(script)
        (staging / WORLD_LAUNCH).chmod(0o755)
    return WorldLaunch(out_dir, out_dir / REPO_DIR, out_dir / WORLD_LAUNCH, layout, needed, devices)

"""A Triton MPI world rendered beside a finished build for other instance counts: its role configs and mpirun line
follow the new layout, the build's own counts give the build's files back, and every refusal names its numbers."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.unit.controller.test_k8s_spec import finished_engines
from trtpd.errors import ConfigError
from trtpd.schema.pbtxt import load_model_config, parameters
from trtpd.trtllm.deploy import REPO_DIR, TRITON_LAUNCH, plan_deploy, write_deploy
from trtpd.trtllm.launch import TritonPorts
from trtpd.trtllm.recipe import recipes_dir
from trtpd.trtllm.run import prepare, write_configs
from trtpd.trtllm.world import render_world, world_gpus

PORTS = TritonPorts(9000, 9001, 9002)


@pytest.fixture(scope="module")
def deploy(tmp_path_factory) -> Path:
    """A finished llama-2-70b build, prefill TP2 and decode TP4, one instance each (6 GPUs)."""
    mount = tmp_path_factory.mktemp("engines")
    return write_deploy(plan_deploy(finished_engines(mount)))


def role(repo: Path, name: str) -> tuple[dict[str, str], int]:
    config = load_model_config(repo / name / "config.pbtxt")
    return parameters(config), config.instance_group[0].count


def test_world_gpus_counts_tp_times_pp_per_instance(deploy):
    assert world_gpus(deploy, {"prefill": 1, "decode": 1}) == 2 + 4
    assert world_gpus(deploy, {"prefill": 2, "decode": 1}) == 2 * 2 + 4
    assert world_gpus(deploy, {"prefill": 1, "decode": 3}) == 2 + 3 * 4


def test_the_build_counts_give_the_build_back(deploy, tmp_path):
    world = render_world(deploy, {"prefill": 1, "decode": 1}, (0, 1, 2, 3, 4, 5), tmp_path / "w", TritonPorts())
    built = deploy / REPO_DIR
    files = sorted(p.relative_to(built) for p in built.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(world.repo) for p in world.repo.rglob("*") if p.is_file())
    for rel in files:
        assert (world.repo / rel).read_bytes() == (built / rel).read_bytes(), rel
    # the script: the build's, but for its own repository and python-backend shared memory, the build's
    # DEPLOY_DIR and the GPUs it was given
    text = world.script.read_text()
    assert text.count("shm-region-prefix-name=trtpd8000_rank") == 7
    ours = text.replace(str(world.repo), str(built)).replace("trtpd8000_rank", "prefix").splitlines()
    theirs = (deploy / TRITON_LAUNCH).read_text().splitlines()
    assert [line for line in ours if line not in theirs] == [
        "export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5", f"DEPLOY_DIR={deploy}"]
    assert [line for line in theirs if line not in ours] == ['DEPLOY_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"']


def test_a_2p1d_world_has_its_own_ranks_gpus_and_instances(deploy, tmp_path):
    world = render_world(deploy, {"prefill": 2, "decode": 1}, (2, 3, 4, 5, 6, 7, 8, 9), tmp_path / "w2p1d", PORTS)
    assert (world.gpus_needed, world.cuda_visible_devices, world.layout.world_size) == (8, "2,3,4,5,6,7,8,9", 9)
    assert world.repo == tmp_path / "w2p1d" / "model_repository" and os.access(world.script, os.X_OK)
    prefill, prefill_count = role(world.repo, "prefill")
    decode, decode_count = role(world.repo, "decode")
    assert (prefill["participant_ids"], prefill["gpu_device_ids"], prefill_count) == ("1,2;3,4", "0,1;2,3", 2)
    assert (decode["participant_ids"], decode["gpu_device_ids"], decode_count) == ("5,6,7,8", "4,5,6,7", 1)
    assert prefill["gpt_model_path"] == str(deploy.parent / "prefill-tp2")
    text = world.script.read_text()
    assert "export CUDA_VISIBLE_DEVICES=2,3,4,5,6,7,8,9\n" in text and f"\nDEPLOY_DIR={deploy}\n" in text
    ranks = text.split("exec mpirun ", 1)[1].rstrip("\n").split(" \\\n    ")[1:]
    assert len(ranks) == 9 == text.count(f"--model-repository={world.repo} ")
    assert ranks[0].startswith("-n 1 ") and all(r.startswith(": -n 1 ") for r in ranks[1:])
    assert all("--http-port=9000 --grpc-port=9001 --metrics-port=9002" in r for r in ranks)
    assert all(f"--backend-config=python,shm-region-prefix-name=trtpd9000_rank{n}_" in r.split()
               for n, r in enumerate(ranks))
    assert "--load-model" not in ranks[0]
    assert all(r.endswith("--model-control-mode=explicit --load-model=prefill --load-model=decode") for r in ranks[1:])
    assert "# world_size = 2 x prefill TP2*PP1 + 1 x decode TP4*PP1 + 1 orchestrator = 9" in text


def test_refusals_name_the_numbers(deploy, tmp_path):
    out = tmp_path / "w"
    with pytest.raises(ConfigError, match=r"needs 8 GPUs; got 6"):
        render_world(deploy, {"prefill": 2, "decode": 1}, (0, 1, 2, 3, 4, 5), out, PORTS)
    with pytest.raises(ConfigError, match=r"\{'prefill': 0, 'decode': 1\}: need prefill and decode, each at least 1"):
        render_world(deploy, {"prefill": 0, "decode": 1}, (), out, PORTS)
    with pytest.raises(ConfigError, match=r"\{'decode': 1\}: need prefill and decode"):
        world_gpus(deploy, {"decode": 1})
    with pytest.raises(ConfigError, match=r"GPU ids \(0, 0, 1, 2, 3, 4\): each must be a distinct"):
        render_world(deploy, {"prefill": 1, "decode": 1}, (0, 0, 1, 2, 3, 4), out, PORTS)
    with pytest.raises(ConfigError, match=r"not a tensorrt-llm deploy folder .*launch_triton.sh"):
        render_world(tmp_path, {"prefill": 1, "decode": 1}, (0, 1, 2, 3, 4, 5), out, PORTS)
    assert not out.exists()
    with pytest.raises(ConfigError, match=r"already exists; a world is rendered into a new folder"):
        render_world(deploy, {"prefill": 1, "decode": 1}, (0, 1, 2, 3, 4, 5), tmp_path, PORTS)


def test_a_configs_only_build_is_not_finished(request_for, tmp_path):
    deploy = write_configs(prepare(request_for(engines_dir=tmp_path, prefill_tp=2, decode_tp=4)), force=False)
    with pytest.raises(ConfigError, match=r"prefill-tp2: .* status planned; a world needs a finished tensorrtllm"):
        world_gpus(deploy, {"prefill": 1, "decode": 1})


def test_a_build_made_with_other_recipes_is_refused(deploy, tmp_path):
    recipes = tmp_path / "recipes"
    shutil.copytree(recipes_dir(), recipes)
    decode = recipes / "decode.yaml"
    decode.write_text(decode.read_text().replace("kv_cache_free_gpu_mem_fraction: 0.85", "kv_cache_free_gpu_mem_fraction: 0.8"))
    with pytest.raises(ConfigError, match=r"decode/config.pbtxt:\d+: '    string_value: \"0.85\"' where the recipes "
                                          r".* render '    string_value: \"0.8\"' for this build"):
        render_world(deploy, {"prefill": 1, "decode": 1}, (0, 1, 2, 3, 4, 5), tmp_path / "w", PORTS, recipes=recipes)

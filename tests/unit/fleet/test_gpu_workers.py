"""Real trtllm-serve workers from `trtpd build`'s serve-pytorch/ (trtpd/fleet/gpu_workers.py) and the one starter that
runs them (ServeStarter with gpus): the command line, its options YAML and its environment, per instance."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from trtpd.cli.main import main
from trtpd.deploy.spec import ReferenceDeployment
from trtpd.errors import ConfigError
from trtpd.fleet.gpu_workers import load_gpu_workers
from trtpd.fleet.instance import InstancePlan
from trtpd.fleet.records import FleetRecord
from trtpd.fleet.serve_workers import ServeStarter
from trtpd.fleet.tritonserver import ServerPorts, free_port
from trtpd.trtllm.options import check_args


def configs(tmp_path: Path, checkpoint: Path, *flags: str) -> Path:
    """`trtpd build --configs-only` of tiny-llama served from `checkpoint`: its serve-pytorch/ folder."""
    out = tmp_path / "gpu-engines"
    assert main(["build", "--model", "tiny-llama", "--configs-only", "--hf-model", str(checkpoint),
                 "--engines-dir", str(out), *flags]) == 0
    return out / "tiny-llama" / "deploy" / "serve-pytorch"


@pytest.fixture(scope="module")
def serve_dir(fp16_root, tmp_path_factory) -> Path:
    return configs(tmp_path_factory.mktemp("serve"), fp16_root / "checkpoint", "--no-fp8", "--prefill-tp", "2",
                   "--decode-tp", "4")


def pairs(argv: list[str]) -> dict[str, str]:
    return dict(zip(argv[2::2], argv[3::2]))


def test_the_worker_is_the_rendered_one_on_its_own_address_and_without_a_router(serve_dir, fp16_root):
    workers = load_gpu_workers(serve_dir)
    assert set(workers.roles) == {"prefill", "decode"}
    assert (workers.role("prefill").gpus_per_instance, workers.role("decode").gpus_per_instance) == (2, 4)
    argv = workers.argv("prefill", "127.0.0.1", 9123, Path("/x/prefill.yaml"))
    assert argv[:2] == ["trtllm-serve", str(fp16_root / "checkpoint")]      # the checkpoint launch.sh serves
    flags = pairs(argv)
    assert {k: flags[k] for k in ("--backend", "--host", "--port", "--server_role", "--tp_size",
                                  "--extra_llm_api_options")} == {
        "--backend": "pytorch", "--host": "127.0.0.1", "--port": "9123", "--server_role": "CONTEXT",
        "--tp_size": "2", "--extra_llm_api_options": "/x/prefill.yaml"}
    assert flags["--tokenizer"] == str(serve_dir.parent / "tokenizer")
    assert "--disagg_cluster_uri" not in flags           # no router: the gateway reads fleet.json
    assert not check_args("trtllm-serve", list(flags.items()))
    assert pairs(workers.argv("decode", "127.0.0.1", 1, Path("d.yaml")))["--server_role"] == "GENERATION"
    assert workers.role("decode").max_input_len == 2048 and workers.role("decode").max_seq_len == 2560


def test_the_options_are_the_rendered_yaml_without_the_router_registration(serve_dir):
    workers = load_gpu_workers(serve_dir)
    rendered = yaml.safe_load((serve_dir / "prefill.yaml").read_text())
    options = workers.role_options("prefill")
    assert "disagg_cluster" in rendered and "disagg_cluster" not in options
    assert options == {k: v for k, v in rendered.items() if k != "disagg_cluster"}
    spec = workers.role_options("decode", "nixl", 5000)["cache_transceiver_config"]
    assert (spec["backend"], spec["kv_transfer_timeout_ms"]) == ("NIXL", 5000)
    assert workers.role_options("decode")["cache_transceiver_config"]["backend"] == "UCX"   # not changed in place


def test_the_command_is_replaceable_and_checked(serve_dir):
    twin = load_gpu_workers(serve_dir, [sys.executable, "-m", "trtpd.serve_twin"])
    assert twin.argv("decode", "127.0.0.1", 1, Path("d.yaml"))[:3] == [sys.executable, "-m", "trtpd.serve_twin"]
    with pytest.raises(ConfigError, match="serve command"):
        load_gpu_workers(serve_dir, [])


def test_an_unfinished_checkpoint_or_a_wrong_folder_is_refused(tmp_path, fp16_root):
    fp8 = configs(tmp_path, fp16_root / "checkpoint", "--fp8")      # checkpoint.sh makes checkpoints/hf-fp8
    with pytest.raises(ConfigError, match=r"hf-fp8 is not complete .*run .*checkpoint.sh first"):
        load_gpu_workers(fp8)
    with pytest.raises(ConfigError, match="no launch.sh here; point --serve-dir"):
        load_gpu_workers(tmp_path)


def test_the_starter_gives_each_instance_its_gpus_key_and_ucx_settings(serve_dir, tmp_path, monkeypatch):
    """The one starter with gpus: the command (here a program that records what it got), CUDA_VISIBLE_DEVICES its
    set, the deployment key for the twin, upstream's UCX settings; the record holds the set (fleet.json)."""
    monkeypatch.setenv("TRTPD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("UCX_RNDV_SCHEME", "get_zcopy")             # the operator's own setting wins
    record = "import json, os, sys; json.dump({'argv': sys.argv, 'env': dict(os.environ)}, open('got.json', 'w'))"
    workers = load_gpu_workers(serve_dir, [sys.executable, "-c", record])
    fleet = FleetRecord("gpus", "disaggregated", "", str(tmp_path / "kv.key"), "")
    starter = ServeStarter(ReferenceDeployment(build_root=tmp_path), transceiver=None, gpus=workers)
    plan = InstancePlan("decode-0", "decode", [0], ServerPorts(free_port("127.0.0.1"), 0, 0), gpus=(4, 5, 6, 7))
    inst = starter.start(fleet, plan)
    inst.server._popen.wait(30)
    got = json.loads((Path(inst.server.repo) / "got.json").read_text())
    env = got["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert env["TRTPD_KV_KEY_FILE"] == str(tmp_path / "kv.key")
    assert (env["UCX_MEMTYPE_CACHE"], env["UCX_RNDV_SCHEME"]) == ("n", "get_zcopy")
    flags = dict(zip(got["argv"][2::2], got["argv"][3::2]))
    assert flags["--server_role"] == "GENERATION" and flags["--port"] == str(plan.ports.http)
    options = yaml.safe_load(Path(flags["--extra_llm_api_options"]).read_text())
    assert options == workers.role_options("decode")
    assert (inst.gpus, inst.protocol, inst.max_input_len) == ([4, 5, 6, 7], "trtllm-serve", 2048)
    assert starter.start_timeout_s == workers.start_timeout_s > 240


def test_the_starter_refuses_a_set_of_the_wrong_size(serve_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("TRTPD_HOME", str(tmp_path / "home"))
    starter = ServeStarter(ReferenceDeployment(build_root=tmp_path), None, load_gpu_workers(serve_dir))
    fleet = FleetRecord("gpus", "disaggregated", "", str(tmp_path / "kv.key"), "")
    plan = InstancePlan("prefill-0", "prefill", [0], ServerPorts(free_port("127.0.0.1"), 0, 0), gpus=(0,))
    with pytest.raises(ConfigError, match=r"given GPUs \[0\], but its worker runs tp_size x pp_size = 2"):
        starter.start(fleet, plan)


def test_the_twin_reads_the_deployment_key_from_the_environment(tmp_path):
    from trtpd.serve_twin.options import parse_args
    argv = ["model", "--server_role", "CONTEXT"]
    assert parse_args(argv, {"TRTPD_KV_KEY_FILE": str(tmp_path / "k")}).key_file == tmp_path / "k"
    with pytest.raises(ConfigError, match="needs --twin_key_file"):
        parse_args(argv, {})
    assert parse_args(argv + ["--twin_key_file", "own"], {"TRTPD_KV_KEY_FILE": "env"}).key_file == Path("own")

"""The two container layouts as data, the path choice, and the docker/compose files for both paths."""

from __future__ import annotations

import shlex

import pytest
import yaml

from trtpd.trtllm.containers import CONTAINERS, choose_container, container_layout, detect_container
from trtpd.trtllm.run import prepare
from trtpd.errors import ConfigError


def test_layouts_come_from_the_dockerfiles():
    triton, release = CONTAINERS["triton-25.12"], CONTAINERS["trtllm-1.2.1"]
    assert (triton.image, triton.examples_dir) == ("nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3", "/app/examples")
    assert release.examples_dir == "/app/tensorrt_llm/examples"
    assert "Dockerfile" in triton.source and "Dockerfile" in release.source


@pytest.mark.parametrize("name", sorted(CONTAINERS))
def test_detection_finds_the_layout_whose_examples_exist(tmp_path, name):
    layout = CONTAINERS[name]
    for script in ("quantization/quantize.py", "models/core/llama/convert_checkpoint.py"):
        path = tmp_path / layout.examples_dir.lstrip("/") / script
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    assert detect_container(tmp_path) == layout
    assert choose_container("auto", tmp_path) == layout


def test_auto_without_examples_defaults_to_the_triton_container(tmp_path):
    assert detect_container(tmp_path) is None
    assert choose_container("auto", tmp_path).name == "triton-25.12"
    with pytest.raises(ConfigError, match="--container nope: use one of triton-25.12, trtllm-1.2.1 or auto"):
        container_layout("nope")


@pytest.fixture
def files(request_for, tmp_path):
    prepared = prepare(request_for(prefill_tp=2, decode_tp=4, engines_dir=tmp_path))
    return prepared.deploy.files


def test_triton_docker_run_mounts_engines_and_binds_localhost(files, tmp_path):
    text = files["containers/docker-run-triton.sh"]
    argv = shlex.split(text.split("exec ", 1)[1].replace("\\\n", " "))
    assert argv[:3] == ["docker", "run", "--rm"]
    assert argv[argv.index("--gpus") + 1] == '"device=0,1,2,3,4,5"'
    assert f"{tmp_path / 'llama-2-70b'}:{tmp_path / 'llama-2-70b'}" in argv
    assert "${BIND}:8000:8000" in argv and 'BIND="${BIND:-127.0.0.1}"' in text
    assert argv[-3:] == ["nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3", "bash",
                         str(tmp_path / "llama-2-70b" / "deploy" / "launch_triton.sh")]
    assert "prefill 0: GPU(s) 0,1" in text and "decode 0: GPU(s) 2,3,4,5" in text


def test_serve_compose_gives_each_server_its_own_gpus(files):
    compose = yaml.safe_load(files["containers/compose.trtllm-serve.yaml"])["services"]
    gpus = {name: s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
            for name, s in compose.items() if "deploy" in s}
    assert gpus == {"prefill-0": ["0", "1"], "decode-0": ["2", "3", "4", "5"]}
    assert compose["router"]["command"][:2] == ["trtllm-serve", "disaggregated"]
    assert compose["router"]["depends_on"] == ["prefill-0", "decode-0"]
    assert compose["prefill-0"]["environment"]["UCX_MEMTYPE_CACHE"] == "n"


def test_triton_compose_is_one_service_with_every_gpu(files):
    service = yaml.safe_load(files["containers/compose.triton.yaml"])["services"]["triton"]
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == [str(i) for i in range(6)]
    assert service["ports"][0] == "${BIND:-127.0.0.1}:8000:8000"
    assert service["ipc"] == "host"


def test_launch_scripts_install_the_python_copy_and_set_ucx(files):
    triton = files["launch_triton.sh"]
    assert 'echo "$DEPLOY_DIR/python" > "$SITE_PACKAGES/trtpd-deploy.pth"' in triton
    assert "export PYTHONPATH" not in triton and "-x PYTHONPATH" not in triton   # the stub ignores it
    serve = files["trtllm-serve/launch.sh"]
    for name, value in (("UCX_MEMTYPE_CACHE", "n"), ("UCX_CUDA_IPC_ENABLE_MNNVL", "n"), ("UCX_RNDV_SCHEME", "put_zcopy")):
        assert f"export {name}=${{{name}:-{value}}}" in serve

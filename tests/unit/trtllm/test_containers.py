"""The two container layouts as data, the path choice, and the docker/compose files for both paths."""

from __future__ import annotations

import shlex
import subprocess

import pytest
import yaml

from trtpd.trtllm.containers import (CONTAINERS, DEFAULT_CONTAINER, choose_container, container_layout,
                                     detect_container)
from trtpd.trtllm.deploy import write_deploy
from trtpd.trtllm.run import prepare
from trtpd.trtllm.versions import PINNED
from trtpd.errors import ConfigError

TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"


def test_layouts_come_from_the_dockerfiles():
    triton, release = CONTAINERS["triton-26.04"], CONTAINERS["trtllm-1.2.1"]
    assert (triton.image, triton.examples_dir) == (TRITON_IMAGE, "/app/examples")
    assert release.examples_dir == "/app/tensorrt_llm/examples"
    assert "Dockerfile" in triton.source and "Dockerfile" in release.source
    assert triton.has_tritonserver and not release.has_tritonserver


@pytest.mark.parametrize("name", sorted(CONTAINERS))
def test_every_layout_ships_the_pinned_stack(name):
    layout = CONTAINERS[name]
    assert (layout.tensorrt_llm, layout.tensorrt) == (PINNED.tensorrt_llm, PINNED.tensorrt)
    assert layout.evidence        # docs/containers.md has the long form


@pytest.mark.parametrize("name, shipped", [("triton-25.12", "1.1.0"), ("triton-26.03", "1.2.0")])
def test_images_with_another_tensorrt_llm_are_refused_with_the_one_to_use(name, shipped):
    with pytest.raises(ConfigError) as caught:
        container_layout(name)
    message = str(caught.value)
    assert f"TensorRT-LLM {shipped}" in message and TRITON_IMAGE in message
    assert f"--container {DEFAULT_CONTAINER}" in message


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
    assert choose_container("auto", tmp_path).name == "triton-26.04"
    with pytest.raises(ConfigError, match="--container nope: use one of triton-26.04, trtllm-1.2.1 or auto"):
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
    assert argv[-3:] == [TRITON_IMAGE, "bash",
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


@pytest.mark.parametrize("name", sorted(CONTAINERS))
def test_triton_launch_files_only_name_images_with_tritonserver(request_for, tmp_path, name):
    layout = CONTAINERS[name]
    files = prepare(request_for(prefill_tp=2, decode_tp=4, engines_dir=tmp_path), container=layout).deploy.files
    container_files = {rel: text for rel, text in files.items() if rel.startswith("containers/")}
    assert any("trtllm-serve" in rel for rel in container_files)          # trtllm-serve runs in either image
    for rel, text in container_files.items():
        if "launch_triton.sh" in text:
            assert layout.has_tritonserver, f"{rel} starts Triton in {layout.image}, which has no tritonserver"
    assert any("triton." in rel or rel.endswith("-triton.sh") for rel in container_files) == layout.has_tritonserver


def test_the_release_image_routes_to_trtllm_serve_only(request_for, tmp_path):
    prepared = prepare(request_for(prefill_tp=2, decode_tp=4, engines_dir=tmp_path),
                       container=CONTAINERS["trtllm-1.2.1"])
    assert sorted(rel for rel in prepared.deploy.files if rel.startswith("containers/")) == [
        "containers/compose.trtllm-serve.yaml", "containers/docker-run-trtllm-serve.sh"]
    assert f"Triton path: not in nvcr.io/nvidia/tensorrt-llm/release:1.2.1 (no tritonserver); run " \
           f"launch_triton.sh in {TRITON_IMAGE}" in prepared.text()


def test_launch_triton_stops_in_an_image_without_tritonserver(request_for, tmp_path):
    """Run here (no /opt/tritonserver): the script stops before anything else and names the image to use."""
    deploy_dir = write_deploy(prepare(request_for("llama-3.1-8b", prefill_tp=1, decode_tp=1, fp8=False,
                                                  engines_dir=tmp_path)).deploy)
    out = subprocess.run(["bash", str(deploy_dir / "launch_triton.sh")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert f"{PINNED.tritonserver_bin} is not in this image" in out.stderr and TRITON_IMAGE in out.stderr
    script = (deploy_dir / "launch_triton.sh").read_text()
    assert script.index(f"-x {PINNED.tritonserver_bin} ]") < script.index("SITE_PACKAGES=")   # before any write

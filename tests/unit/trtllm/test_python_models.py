"""The GPU repository's python models run in the Triton 26.04 trtllm container as it ships: no trtpd installed.

They import trtpd.serving.*, which the deploy folder carries in python/; launch_triton.sh writes a .pth
into the site-packages of the python3 on PATH (the python-backend stub ignores PYTHONPATH). A fresh
interpreter with the repository and its editable install off sys.path imports every model.py from the
deploy folder alone, every module-level import outside trtpd is one the container has, and the launch
script's install lines work in a fresh venv.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trtpd.trtllm.deploy import plan_deploy, write_deploy
from trtpd.trtllm.launch import DEPS_DIR, PTH_NAME, TRITONCLIENT, grpc_client_lines, install_python_package_lines
from trtpd.trtllm.plan import plan_build
from trtpd.trtllm.recipe import load_recipes
from trtpd.trtllm.spec import BuildOverrides, make_request

REPO_ROOT = Path(__file__).resolve().parents[3]
PYTHON_MODELS = ("preprocessing", "postprocessing", "disagg_bls")
# In both containers' python (backend Dockerfile: torch copied into /opt/venv-tritonserver, numpy with it;
# transformers comes with tensorrt_llm, and tokenizers with transformers, which requires it (its PyPI metadata:
# Requires-Dist tokenizers); triton_python_backend_utils is the python backend's own module.
CONTAINER_PACKAGES = {"numpy", "torch", "transformers", "tokenizers", "triton_python_backend_utils"}

FAKE_PB_UTILS = "TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1\n"

IMPORT_ALL = """
import importlib.util, json, sys
deploy, fake, repo_root = sys.argv[1:4]
sys.path = [p for p in sys.path if p not in ("", ".", repo_root, repo_root + "/")]
sys.path[:0] = [deploy + "/python", fake]
for name in ("preprocessing", "postprocessing", "disagg_bls"):
    spec = importlib.util.spec_from_file_location("model_" + name, f"{deploy}/model_repository/{name}/1/model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert hasattr(module, "TritonPythonModel"), name
import trtpd
print(json.dumps({"trtpd": trtpd.__file__, "loaded": sorted(m for m in sys.modules if m.startswith("trtpd"))}))
"""


@pytest.fixture(scope="module")
def deploy(tmp_path_factory) -> Path:
    engines = tmp_path_factory.mktemp("engines")
    request = make_request("llama-3.1-8b", load_recipes(), BuildOverrides(fp8=False), engines_dir=engines)
    return write_deploy(plan_deploy(plan_build(request)))


def test_models_import_from_the_deploy_folder_alone(deploy, tmp_path):
    (tmp_path / "triton_python_backend_utils.py").write_text(FAKE_PB_UTILS)
    out = subprocess.run([sys.executable, "-I", "-c", IMPORT_ALL, str(deploy), str(tmp_path), str(REPO_ROOT)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["trtpd"].startswith(str(deploy / "python")), result["trtpd"]
    assert "trtpd.serving.bls_model" in result["loaded"] and "trtpd.serving.text_models" in result["loaded"]


def _module_imports(path: Path) -> set[str]:
    """Top-level names imported at module level (not inside functions, not under TYPE_CHECKING)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_module_level_imports_outside_trtpd_are_in_the_container(deploy):
    root = deploy / "python"
    todo = [deploy / "model_repository" / m / "1" / "model.py" for m in PYTHON_MODELS]
    seen, third_party = set(), set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _module_imports(path):
            top = name.split(".")[0]
            if top == "trtpd":
                parts = name.split(".")
                for candidate in (root.joinpath(*parts).with_suffix(".py"), root.joinpath(*parts, "__init__.py")):
                    if candidate.is_file():
                        todo.append(candidate)
            elif top not in sys.stdlib_module_names and top != "__future__":
                third_party.add(top)
    assert third_party <= CONTAINER_PACKAGES, f"not in the container: {sorted(third_party - CONTAINER_PACKAGES)}"
    assert {"numpy", "triton_python_backend_utils"} <= third_party


def test_launch_install_lines_make_trtpd_importable_in_isolated_mode(deploy, tmp_path):
    venv = tmp_path / "venv"          # stands in for /opt/venv-tritonserver: no trtpd, no pip
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    script = "set -euo pipefail\n" + f'DEPLOY_DIR="{deploy}"\n' + "\n".join(install_python_package_lines()) + "\n"
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    out = subprocess.run(["bash", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert list(venv.glob(f"lib/python*/site-packages/{PTH_NAME}"))
    found = subprocess.run([str(venv / "bin" / "python3"), "-I", "-c", "import trtpd; print(trtpd.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert found.stdout.strip().startswith(str(deploy / "python")), found.stderr


def test_launch_install_lines_refuse_a_missing_copy(tmp_path):
    script = "set -euo pipefail\n" + f'DEPLOY_DIR="{tmp_path}"\n' + "\n".join(install_python_package_lines()) + "\n"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "python/trtpd is missing" in out.stderr


def _grpc_client_script(deploy: Path, venv: Path) -> tuple[str, dict]:
    site = next(venv.glob("lib/python*/site-packages"))
    script = ("set -euo pipefail\n" + f'DEPLOY_DIR="{deploy}"\nSITE_PACKAGES="{site}"\n' + "\n".join(grpc_client_lines())
              + "\necho reached-the-end\n")
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    return script, env


def test_launch_grpc_client_lines_pass_where_python3_has_tritonclient(deploy, tmp_path):
    """disagg_bls reaches the role models with tritonclient's gRPC client: a python3 that has it (a venv that
    sees trtpd's own environment, which pins it) needs no install."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True,
                   timeout=120)
    (next(venv.glob("lib/python*/site-packages")) / "sees-trtpds-env.pth").write_text(
        next(p for p in sys.path if p.endswith("site-packages")) + "\n")
    script, env = _grpc_client_script(deploy, venv)
    out = subprocess.run(["bash", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "reached-the-end" in out.stdout, out.stderr
    assert "installing" not in out.stderr and not (deploy / DEPS_DIR).exists()


def test_launch_grpc_client_lines_stop_naming_what_to_install_where_pip_cannot(deploy, tmp_path):
    venv = tmp_path / "venv"          # no tritonclient and no pip: nothing is fetched
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    script, env = _grpc_client_script(deploy, venv)
    out = subprocess.run(["bash", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "reached-the-end" not in out.stdout
    assert f"pip could not install tritonclient[grpc]=={TRITONCLIENT}" in out.stderr

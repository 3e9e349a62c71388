"""Lint everything `trtpd build` produced for one model: the engine pair, the repository, the
MPI launch script, the trtllm-serve configs (engines, and the PyTorch backend's) and their ports. Any part that
is absent is skipped."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from trtpd.schema.manifest import MANIFEST_NAME, load_manifest
from trtpd.errors import ConfigError
from trtpd.lint.engine_pair import lint_engine_pair
from trtpd.lint.findings import Finding
from trtpd.lint.ports import lint_ports
from trtpd.lint.repository import lint_repository
from trtpd.lint.disagg_cluster import lint_launch_cluster
from trtpd.lint.serve_configs import (lint_serve_configs, lint_serve_launch, load_yaml, router_ports, serve_backend,
                                      tokenizer_finding)
from trtpd.schema.pbtxt import parameters, parse_model_config

_TRITON_PORT = re.compile(r"--(http|grpc|metrics)-port[= ](\d+)")


@dataclass(frozen=True)
class DeploymentPaths:
    prefill_manifest: Path | None = None
    decode_manifest: Path | None = None
    repo: Path | None = None
    launch_script: Path | None = None
    serve_dir: Path | None = None
    serve_pytorch_dir: Path | None = None


def _one(model_dir: Path, role: str) -> Path | None:
    found = sorted(p.parent for p in model_dir.glob(f"{role}-tp*/{MANIFEST_NAME}"))
    if len(found) > 1:
        raise ConfigError(f"{model_dir}: several {role} engines ({', '.join(p.name for p in found)}); "
                          f"choose one with --{role} PATH")
    return found[0] / MANIFEST_NAME if found else None


def discover(model_dir: Path) -> DeploymentPaths:
    """engines/<model>/ as trtpd build lays it out."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ConfigError(f"{model_dir}: no such folder; pass engines/<model> as trtpd build wrote it")
    deploy = model_dir / "deploy"

    def existing(p: Path) -> Path | None:
        return p if p.exists() else None

    return DeploymentPaths(_one(model_dir, "prefill"), _one(model_dir, "decode"),
                           existing(deploy / "model_repository"), existing(deploy / "launch_triton.sh"),
                           existing(deploy / "trtllm-serve"), existing(deploy / "serve-pytorch"))


def triton_ports(script_text: str) -> dict[str, int]:
    """Ports of the first tritonserver in a launch script (every rank gets the same ones)."""
    ports = {}
    for kind, port in _TRITON_PORT.findall(script_text):
        ports.setdefault(f"triton {kind}", int(port))
    return ports


_DECODE_TOKENS = re.compile(r"--max_num_tokens (\d+)[^\n]*decode\.yaml")
_SERVER_PORT = re.compile(r"trtllm-serve\s+(?!disaggregated\b)\S+.*?--port[\s=]+(\d+).*?(\w+)\.yaml")


def decode_worker_num_tokens(launch_script: str) -> int | None:
    """The smallest --max_num_tokens among the decode servers of a trtllm-serve launch.sh, if any."""
    found = [int(n) for n in _DECODE_TOKENS.findall(launch_script)]
    return min(found) if found else None


def server_ports(launch_script: str) -> dict[str, int]:
    """The --port of each trtllm-serve server in a launch script, named by its YAML's role and its order."""
    ports = {}
    for i, (port, role) in enumerate(_SERVER_PORT.findall(launch_script)):
        ports[f"{role}[{i}] --port {port}"] = int(port)
    return ports


def lint_tokenizer_dirs(repo: Path) -> list[Finding]:
    """The python models of a written GPU repository read `<tokenizer_dir>/tokenizer.json` and download nothing."""
    findings = []
    for model in ("preprocessing", "postprocessing"):
        path = repo / model / "config.pbtxt"
        if not path.is_file():
            continue
        value = parameters(parse_model_config(path.read_text(), str(path))).get("tokenizer_dir", "")
        subject = f"{path}: tokenizer_dir"
        if not value.startswith("/"):
            findings.append(tokenizer_finding(subject, value))
        elif not (Path(value) / "tokenizer.json").is_file():
            findings.append(tokenizer_finding(subject, value, missing=True))
    return findings


def lint_deployment(paths: DeploymentPaths, *, max_prompt_tokens: int | None = None,
                    max_output_tokens: int | None = None, check_ports_free: bool = True,
                    host: str = "127.0.0.1") -> list[Finding]:
    findings: list[Finding] = []
    prompt, decode_num_tokens = max_prompt_tokens, None
    if paths.prefill_manifest and paths.decode_manifest:
        prefill, decode = load_manifest(paths.prefill_manifest), load_manifest(paths.decode_manifest)
        decode_num_tokens = decode.build_config.max_num_tokens
        prompt = prompt if prompt is not None else prefill.build_config.max_input_len
        findings += lint_engine_pair(prefill, decode, max_prompt_tokens=prompt, max_output_tokens=max_output_tokens)
    elif paths.prefill_manifest or paths.decode_manifest:
        raise ConfigError("the engine pair needs both a prefill and a decode manifest")
    if paths.repo:
        findings += lint_repository(paths.repo, launch_script=paths.launch_script)
        findings += lint_tokenizer_dirs(paths.repo)
    if paths.launch_script:
        findings += lint_ports(triton_ports(paths.launch_script.read_text()), host=host, check_free=check_ports_free)
    for serve_dir in (paths.serve_dir, paths.serve_pytorch_dir):
        if serve_dir:
            if prompt is None:
                raise ConfigError("linting trtllm-serve configs needs the longest prompt: pass --max-prompt-tokens "
                                  "or the engine manifests")
            findings += lint_serve_dir(serve_dir, max_prompt_tokens=prompt, decode_num_tokens=decode_num_tokens,
                                       check_ports_free=check_ports_free, host=host)
    return findings


def lint_serve_dir(s: Path, *, max_prompt_tokens: int, decode_num_tokens: int | None = None,
                   check_ports_free: bool = True, host: str = "127.0.0.1") -> list[Finding]:
    """A trtllm-serve folder of either backend (told apart by its launch.sh): role YAMLs, router, launch, ports."""
    launch = (s / "launch.sh").read_text() if (s / "launch.sh").is_file() else ""
    if decode_num_tokens is None:
        decode_num_tokens = decode_worker_num_tokens(launch)
    router = load_yaml(s / "disagg.yaml") if (s / "disagg.yaml").is_file() else None
    backend = serve_backend(launch) or "tensorrt"
    findings = lint_serve_configs(load_yaml(s / "prefill.yaml"), load_yaml(s / "decode.yaml"), router,
                                  max_prompt_tokens=max_prompt_tokens, decode_max_num_tokens=decode_num_tokens,
                                  sources={k: str(s / f"{n}.yaml") for k, n in
                                           (("prefill", "prefill"), ("decode", "decode"), ("router", "disagg"))},
                                  backend=backend)
    if router is not None:
        ports = router_ports(router) | (server_ports(launch) if "disagg_cluster" in router else {})
        findings += lint_ports(ports, host=host, check_free=check_ports_free)
    if launch:
        findings += lint_serve_launch(launch, source=str(s / "launch.sh"))
        findings += lint_launch_cluster(launch, router, source=str(s / "launch.sh"))
    return findings

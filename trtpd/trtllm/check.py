"""Lint a planned build before anything is written (what `trtpd build` and `--dry-run` run)."""

from __future__ import annotations

from pathlib import Path

import yaml

from trtpd.trtllm.deploy import REPO_DIR, SERVE_DIR, SERVE_PYTORCH_DIR, TRITON_LAUNCH, DeployPlan
from trtpd.trtllm.plan import BuildPlan
from trtpd.lint.deployment import server_ports, triton_ports
from trtpd.lint.disagg_cluster import lint_launch_cluster
from trtpd.lint.engine_pair import lint_engine_pair
from trtpd.lint.findings import Finding
from trtpd.lint.ports import lint_ports
from trtpd.lint.repository import launch_world_size, lint_model_configs
from trtpd.lint.serve_configs import lint_serve_configs, lint_serve_launch, router_ports
from trtpd.repo import template
from trtpd.schema.pbtxt import parse_model_config
from trtpd.repo.render import TEMPLATE_SUFFIX, templates_dir


def preview_repository(deploy: DeployPlan, templates: Path | None = None) -> dict[str, str]:
    """{model name: rendered config.pbtxt}, rendered strictly and parsed, without writing anything."""
    templates = templates or templates_dir()
    texts = {}
    for model in deploy.models:
        tmpl = templates / model.template / ("config.pbtxt" + TEMPLATE_SUFFIX)
        text = template.render(tmpl.read_text(), {"model_name": model.name, **model.values}, source=str(tmpl))
        parse_model_config(text, source=f"{tmpl} rendered for model {model.name!r}")
        texts[model.name] = text
    return texts


def lint_plan(plan: BuildPlan, deploy: DeployPlan, configs: dict[str, str]) -> list[Finding]:
    r = plan.request
    findings = lint_engine_pair(plan.prefill.manifest, plan.decode.manifest, max_prompt_tokens=r.max_input_len,
                                max_output_tokens=r.max_output_len)
    findings = [f for f in findings if f.rule != "engine-status"]       # planned engines are not built yet
    script = deploy.files[TRITON_LAUNCH]
    planned = {role.spec.role: role.manifest for role in plan.roles}
    findings += lint_model_configs(configs, root=f"{deploy.deploy_dir / REPO_DIR}/",
                                   launch_world_size=launch_world_size(script), launch_source=TRITON_LAUNCH,
                                   manifests=planned)
    findings += lint_ports(triton_ports(script), check_free=False)
    serve = {name: yaml.safe_load(deploy.files[f"{SERVE_DIR}/{name}.yaml"]) for name in ("prefill", "decode", "disagg")}
    findings += lint_serve_configs(serve["prefill"], serve["decode"], serve["disagg"], max_prompt_tokens=r.max_input_len,
                                   decode_max_num_tokens=r.decode.max_num_tokens)
    findings += lint_serve_launch(deploy.files[f"{SERVE_DIR}/launch.sh"], source=f"{SERVE_DIR}/launch.sh")
    findings += lint_ports(router_ports(serve["disagg"]), check_free=False)
    return findings + lint_pytorch_serve(plan, deploy)


def lint_pytorch_serve(plan: BuildPlan, deploy: DeployPlan) -> list[Finding]:
    """serve-pytorch/ as planned: the PyTorch backend's rules, the disagg_cluster agreement, ports."""
    d, r = SERVE_PYTORCH_DIR, plan.request
    serve = {name: yaml.safe_load(deploy.files[f"{d}/{name}.yaml"]) for name in ("prefill", "decode", "disagg")}
    launch = deploy.files[f"{d}/launch.sh"]
    findings = lint_serve_configs(serve["prefill"], serve["decode"], serve["disagg"], max_prompt_tokens=r.max_input_len,
                                  decode_max_num_tokens=r.decode.max_num_tokens, backend="pytorch",
                                  sources={"prefill": f"{d}/prefill.yaml", "decode": f"{d}/decode.yaml",
                                           "router": f"{d}/disagg.yaml"})
    findings += lint_serve_launch(launch, source=f"{d}/launch.sh")
    findings += lint_launch_cluster(launch, serve["disagg"], source=f"{d}/launch.sh")
    return findings + lint_ports(router_ports(serve["disagg"]) | server_ports(launch), check_free=False)

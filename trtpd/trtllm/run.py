"""`trtpd build --backend tensorrtllm`: plan, lint, then print (--dry-run), write configs
(--configs-only) or run the build. Nothing is written before the plan and its lint pass."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtpd.trtllm.check import lint_plan, preview_repository
from trtpd.trtllm.containers import CONTAINERS, DEFAULT_CONTAINER, ContainerLayout, require_examples
from trtpd.trtllm.deploy import DeployPlan, plan_deploy, write_deploy
from trtpd.trtllm.environment import BuildEnvironment, detect, require_runnable
from trtpd.trtllm.execute import Report, Runner, SubprocessRunner, execute_plan
from trtpd.trtllm.launch import TritonPorts
from trtpd.schema.manifest import EngineManifest, load_manifest, write_manifest
from trtpd.trtllm.plan import BuildPlan, plan_build
from trtpd.trtllm.report import format_plan
from trtpd.trtllm.serve_config import ServeLayout
from trtpd.trtllm.spec import BuildRequest
from trtpd.trtllm.tokenizer_files import missing_message, tokenizer_source
from trtpd.errors import ConfigError
from trtpd.lint.findings import Finding, errors


@dataclass(frozen=True)
class PreparedBuild:
    plan: BuildPlan
    deploy: DeployPlan
    configs: dict[str, str]          # model name -> rendered config.pbtxt
    findings: list[Finding]

    def text(self) -> str:
        return format_plan(self.plan, self.deploy, self.findings)


def prepare(request: BuildRequest, *, tokenizer_dir: str | None = None, triton_ports: TritonPorts = TritonPorts(),
            serve_layout: ServeLayout = ServeLayout(), templates: Path | None = None,
            container: ContainerLayout | None = None) -> PreparedBuild:
    """Plans and lints everything in memory; raises ConfigError when the lint finds errors."""
    plan = plan_build(request)
    deploy = plan_deploy(plan, tokenizer_dir=tokenizer_dir, triton_ports=triton_ports, serve_layout=serve_layout,
                         templates=templates, container=container or CONTAINERS[DEFAULT_CONTAINER])
    configs = preview_repository(deploy, templates)
    findings = lint_plan(plan, deploy, configs)
    if errors(findings):
        raise ConfigError("the planned build fails trtpd lint:\n  " + "\n  ".join(f.format() for f in errors(findings)))
    return PreparedBuild(plan, deploy, configs, findings)


def write_planned_manifests(plan: BuildPlan, force: bool) -> list[Path]:
    """Planned manifests for --configs-only; a finished engine's manifest is never overwritten."""
    written = []
    for role in plan.roles:
        try:
            existing = load_manifest(role.engine_dir)
        except ConfigError:
            existing = None
        if existing is not None and existing.status == "complete" and not force:
            continue
        written.append(write_manifest(role.manifest, role.engine_dir))
    return written


def write_configs(prepared: PreparedBuild, *, force: bool, templates: Path | None = None) -> Path:
    deploy_dir = write_deploy(prepared.deploy, force=force, templates=templates)
    write_planned_manifests(prepared.plan, force)
    return deploy_dir


def require_tokenizer_reachable(prepared: PreparedBuild) -> None:
    """Before any step: the deploy folder's tokenizer must be local now, or come with the build. quantize.py loads
    the model's tokenizer (quantize_by_modelopt.py quantize_and_export -> get_tokenizer ->
    AutoTokenizer.from_pretrained, NVIDIA/TensorRT-LLM@042c510), which puts it in the Hugging Face cache;
    convert_checkpoint.py (no FP8) is not known to, so without quantize.py it must be local from the start."""
    source = prepared.deploy.tokenizer_source
    folder, looked = tokenizer_source(source)
    if folder is None and not any(s.name == "quantize" for s in prepared.plan.unique_steps()):
        raise ConfigError(missing_message(source, looked))


def run_build(prepared: PreparedBuild, *, report: Report, runner: Runner | None = None,
              environment: BuildEnvironment | None = None, force: bool = False,
              templates: Path | None = None) -> list[EngineManifest]:
    """Runs every step where TensorRT-LLM 1.2.x and GPUs are present, then writes the deploy folder."""
    env = environment or detect()
    request = prepared.plan.request
    require_runnable(env, max(s.gpus_per_instance for s in request.roles))
    scripts = sorted({role.checkpoint_step.program[-1] for role in prepared.plan.roles})
    require_examples(prepared.deploy.container, request.examples_dir, scripts)
    require_tokenizer_reachable(prepared)
    versions = {"tensorrt_llm_installed": env.trtllm_version or "none"}
    if env.gpu_names:
        versions["gpu"] = env.gpu_names[0]
    manifests = execute_plan(prepared.plan, runner or SubprocessRunner(), report, versions=versions, force=force)
    deploy_dir = write_deploy(prepared.deploy, force=True, templates=templates, require_tokenizer=True)
    report(f"deploy folder written: {deploy_dir}")
    return manifests

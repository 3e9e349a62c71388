"""Render model-repository templates (triton_models/) into a Triton model repository.

A template folder holds `config.pbtxt.tmpl` plus any other files (`1/model.py`), which are copied
unchanged. Rendering is all-or-nothing: the repository is written to a temporary folder and moved
into place only after every config.pbtxt has been filled strictly and parsed as ModelConfig.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trtpd.errors import ConfigError
from trtpd.repo import template
from trtpd.schema.pbtxt import check_name_matches_folder, parse_model_config
from trtpd.staging import staged_folder

TEMPLATE_SUFFIX = ".tmpl"


def templates_dir() -> Path:
    """triton_models/ from the source tree (editable install) or packaged inside trtpd (wheel)."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "triton_models", here.parent / "triton_models"):
        if candidate.is_dir():
            return candidate
    raise ConfigError("cannot find the triton_models/ template folder; reinstall trtpd")


@dataclass(frozen=True)
class ModelPlan:
    name: str                      # folder name and `name:` in config.pbtxt
    template: str                  # folder under triton_models/
    values: Mapping[str, object] = field(default_factory=dict)


def render_model(plan: ModelPlan, out_dir: Path, templates: Path) -> Path:
    src = templates / plan.template
    if not src.is_dir():
        raise ConfigError(f"model {plan.name!r}: no template folder {src}")
    dst = out_dir / plan.name
    tmpl = src / ("config.pbtxt" + TEMPLATE_SUFFIX)
    if not tmpl.is_file():
        raise ConfigError(f"{src}: missing config.pbtxt{TEMPLATE_SUFFIX}")
    values = {"model_name": plan.name, **plan.values}
    text = template.render(tmpl.read_text(), values, source=str(tmpl))
    config = parse_model_config(text, source=f"{tmpl} rendered for model {plan.name!r}")
    dst.mkdir(parents=True)
    check_name_matches_folder(config, dst)
    (dst / "config.pbtxt").write_text(text)
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if path.is_dir() or path.name.endswith(TEMPLATE_SUFFIX) or "__pycache__" in rel.parts:
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    (dst / "1").mkdir(exist_ok=True)   # Triton loads version folders; an ensemble's is empty
    return dst


def render_repository(models: Sequence[ModelPlan], out_dir: Path, *, templates: Path | None = None,
                      overwrite: bool = False, extra_files: Mapping[str, str] | None = None) -> Path:
    """Renders `models` into `out_dir`; nothing is left behind if any model fails."""
    templates = templates or templates_dir()
    names = [m.name for m in models]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"model name(s) used twice in one repository: {', '.join(dupes)}")
    out_dir = Path(out_dir)
    with staged_folder(out_dir, overwrite=overwrite) as staging:
        for plan in models:
            render_model(plan, staging, templates)
        for rel, text in (extra_files or {}).items():
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            (staging / rel).write_text(text)
    return out_dir

"""Loading YAML into pydantic models with errors that name the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from trtpd.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


def format_validation_error(source: str, exc: ValidationError) -> str:
    lines = [f"{source}: invalid content"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  {where}: {err['msg']}")
    return "\n".join(lines)


def config_path(kind: str, name_or_path: str, folder: Path, lower: bool = False) -> Path:
    """A config file given by path, or by name from `folder` (configs/<kind>s/<name>.yaml)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        return path
    candidate = folder / f"{name_or_path.lower() if lower else name_or_path}.yaml"
    if not candidate.is_file():
        known = ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))
        raise ConfigError(f"unknown {kind} {name_or_path!r}; known: {known} (or pass a path to a YAML file)")
    return candidate


def read_yaml(path: Path) -> object:
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc}); fix the syntax") from None


def load_model(cls: type[M], data: object, source: str) -> M:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc)) from None


def load_yaml_model(cls: type[M], path: Path) -> M:
    return load_model(cls, read_yaml(path), str(path))


def dump_yaml(data: object) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=110)

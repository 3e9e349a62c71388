"""Where trtpd's data folders are: inside the installed package (wheel), else in the source checkout.

A wheel carries configs/ as trtpd/configs, recipes/tensorrtllm/ as trtpd/recipes/tensorrtllm and
triton_models/ as trtpd/triton_models (pyproject.toml, force-include). An editable install or a plain
checkout has them next to the trtpd/ package. Every reader of these folders asks this module.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from trtpd.errors import ConfigError

CONFIG_KINDS = ("hardware", "slo", "workloads", "plans")

# folder inside the installed package -> folder in the source checkout (relative to its root)
_PACKAGED = {
    "configs": "configs",
    "recipes/tensorrtllm": "recipes/tensorrtllm",
    "triton_models": "triton_models",
}


def package_root() -> Path:
    return Path(str(files("trtpd")))


def data_dir(packaged: str) -> Path:
    """The packaged copy of a data folder when present, else the checkout's."""
    root = package_root()
    for candidate in (root / packaged, root.parent / _PACKAGED[packaged]):
        if candidate.is_dir():
            return candidate
    raise ConfigError(f"cannot find trtpd's {_PACKAGED[packaged]}/ folder (looked in {root / packaged} and "
                      f"{root.parent / _PACKAGED[packaged]}); reinstall trtpd")


def configs_dir(kind: str) -> Path:
    """configs/<kind>/ (hardware, slo, workloads, plans)."""
    if kind not in CONFIG_KINDS:
        raise ValueError(f"unknown config kind {kind!r}; known: {', '.join(CONFIG_KINDS)}")
    return data_dir("configs") / kind


def recipes_dir() -> Path:
    """recipes/tensorrtllm/: common.yaml, prefill.yaml, decode.yaml."""
    return data_dir("recipes/tensorrtllm")


def templates_dir() -> Path:
    """triton_models/: the Triton model-repository templates."""
    return data_dir("triton_models")

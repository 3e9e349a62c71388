"""Per-role build recipes: recipes/tensorrtllm/{common,prefill,decode}.yaml as typed objects.

The YAML files carry the reasoning for every default in comments; this module only loads and
validates them, naming the file and key at fault.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from trtpd import resources
from trtpd.errors import ConfigError
from trtpd.perf.yaml_io import load_yaml_model

ROLES = ("prefill", "decode")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CommonRecipe(_Strict):
    tokens_per_block: int = Field(gt=0)
    max_input_len: int = Field(gt=0)
    max_output_len: int = Field(gt=0)
    max_beam_width: Literal[1] = 1
    weights_dtype: Literal["float16", "bfloat16"] = "float16"
    fp8: bool = True
    calib_size: int = Field(default=512, gt=0)
    trtllm_build_flags: dict[str, str] = Field(default_factory=dict)
    transceiver_backend: Literal["UCX", "NIXL"] = "UCX"
    kv_transfer_timeout_ms: int = Field(gt=0)
    decoupled: bool = True


class RoleRecipe(_Strict):
    tp_size: int | Literal["auto"] = "auto"
    pp_size: int = Field(default=1, gt=0)
    max_batch_size: Annotated[int, Field(gt=0)] | Literal["auto"]
    max_num_tokens: int = Field(gt=0)
    kv_cache_free_gpu_mem_fraction: float = Field(gt=0, le=1)
    kv_cache_max_tokens: Annotated[int, Field(gt=0)] | Literal["batch", "none"] = "none"
    enable_kv_cache_reuse: bool
    batch_scheduler_policy: Literal["guaranteed_no_evict", "max_utilization"] = "guaranteed_no_evict"
    enable_chunked_context: bool | Literal["auto"] = "auto"
    cuda_graph_mode: bool = False
    cuda_graph_cache_size: Annotated[int, Field(ge=0)] | Literal["auto"] = 0
    multi_block_mode: bool = True
    max_queue_delay_microseconds: int = Field(default=0, ge=0)
    max_queue_size: int = Field(default=0, ge=0)
    instances: int = Field(default=1, gt=0)


class Recipes(_Strict):
    common: CommonRecipe
    prefill: RoleRecipe
    decode: RoleRecipe

    def role(self, name: str) -> RoleRecipe:
        return self.prefill if name == "prefill" else self.decode


def recipes_dir() -> Path:
    """recipes/tensorrtllm/ from the installed package (trtpd/recipes/tensorrtllm) or the source checkout."""
    folder = resources.recipes_dir()
    if not (folder / "common.yaml").is_file():
        raise ConfigError(f"{folder}: the recipes common.yaml, prefill.yaml, decode.yaml are missing; "
                          f"reinstall trtpd or pass --recipes DIR")
    return folder


def _load(path: Path, model: type[_Strict]) -> _Strict:
    if not path.is_file():
        raise ConfigError(f"{path}: recipe file missing")
    return load_yaml_model(model, path)


def load_recipes(folder: Path | None = None) -> Recipes:
    folder = Path(folder) if folder else recipes_dir()
    return Recipes(common=_load(folder / "common.yaml", CommonRecipe),
                   prefill=_load(folder / "prefill.yaml", RoleRecipe),
                   decode=_load(folder / "decode.yaml", RoleRecipe))

"""The SLO document (configs/slo/<name>.yaml): TTFT and TPOT targets and their attainment.

The planner reads it as an input and the plan file (trtpd.schema.plan) records it.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from trtpd.perf.yaml_io import config_path, load_yaml_model
from trtpd.resources import configs_dir

SLO_DIR = configs_dir("slo")


class Slo(BaseModel):
    """TTFT and TPOT targets, met by `attainment` of the requests (both at once, as DistServe).

    attainment 0.9 means P90 SLOs: at least 90% of requests have TTFT <= ttft_s and TPOT <= tpot_s.
    """

    model_config = ConfigDict(extra="forbid")
    ttft_s: float = Field(gt=0)
    tpot_s: float = Field(gt=0)
    attainment: float = Field(default=0.9, gt=0, lt=1)

    @property
    def percentile(self) -> float:
        return self.attainment * 100


def slo_path(name_or_path: str) -> Path:
    return config_path("SLO", name_or_path, SLO_DIR)


def load_slo(name_or_path: str) -> Slo:
    return load_yaml_model(Slo, slo_path(name_or_path))

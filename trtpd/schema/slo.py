"""The SLO: TTFT and TPOT targets and their attainment. The one SLO type of trtpd.

The planner reads it as a document (configs/slo/<name>.yaml) and the plan file records it; a deployment spec
carries one (`slo:`); the controller's rollout gate and autoscaler judge by it; the gateway counts the requests
meeting it; the simulator measures attainment by it.

One meaning each, live and in simulation:
- TTFT: arrival at the gateway (or the simulated arrival) -> first token out.
- TPOT: per request, (last token - first token) / (output tokens - 1): its mean inter-token time, as DistServe,
  AIConfigurator and the bench tool define it. A one-token request has none and meets that half.
- attainment: the share of requests that must meet both at once; the percentile every check takes is this
  share (0.9: P90), with the one percentile definition (trtpd.percentiles).
Decode is judged by TPOT, not by ITL (each single gap): TPOT is what the SLO states and what the planner sizes
decode for (its per-step time at the batch), the simulator measures it per request, and the gateway has it
per request; a single gap's tail is a stall, which the gateway reports (trtpd_gateway_itl_seconds,
worst_stall) but no decision uses.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trtpd.perf.yaml_io import config_path, load_yaml_model
from trtpd.resources import configs_dir

SLO_DIR = configs_dir("slo")


class Slo(BaseModel):
    """TTFT and TPOT targets, met by `attainment` of the requests (both at once, as DistServe).

    attainment 0.9 means P90 SLOs: at least 90% of requests have TTFT <= ttft_s and TPOT <= tpot_s. The
    defaults (a deployment spec without `slo:`, a gateway started alone) are configs/slo/reference-cpu.yaml's:
    the reference backend's tiny model on 2 CPU cores; the planner and the simulator default to a named
    document (`--slo chat`).
    """

    model_config = ConfigDict(extra="forbid")
    ttft_s: float = Field(default=2.0, gt=0)
    tpot_s: float = Field(default=0.1, gt=0)
    attainment: float = Field(default=0.9, gt=0, lt=1)

    @model_validator(mode="before")
    @classmethod
    def _no_itl(cls, data):
        if isinstance(data, dict) and "itl_s" in data:
            raise ValueError("itl_s: decode is judged by TPOT (each request's mean inter-token time), not by single "
                             "gaps; drop itl_s and state tpot_s")
        return data

    @property
    def percentile(self) -> float:
        return self.attainment * 100


def slo_path(name_or_path: str) -> Path:
    return config_path("SLO", name_or_path, SLO_DIR)


def load_slo(name_or_path: str) -> Slo:
    return load_yaml_model(Slo, slo_path(name_or_path))

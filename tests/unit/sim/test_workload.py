import numpy as np
import pytest

from trtpd.errors import ConfigError
from trtpd.sim.workload import WORKLOAD_DIR, WorkloadSpec, generate_requests, load_workload


def test_shipped_workloads_load():
    for path in sorted(WORKLOAD_DIR.glob("*.yaml")):
        spec = load_workload(str(path))
        assert generate_requests(spec, 5.0, 10, seed=1).input_tokens


def test_poisson_rate_and_determinism():
    spec = load_workload("chat-powerlaw")
    a = generate_requests(spec, 20.0, 20_000, seed=3)
    assert len(a) / a.duration_s == pytest.approx(20.0, rel=0.03)
    gaps = np.diff(a.arrival_s)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)
    assert generate_requests(spec, 20.0, 100, seed=3).arrival_s == a.arrival_s[:100]


def test_gamma_arrivals_have_the_stated_cv():
    spec = load_workload("chat-bursty")
    gaps = np.diff(generate_requests(spec, 10.0, 40_000, seed=0).arrival_s)
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.06)


def test_trace_replay(tmp_path):
    trace = tmp_path / "run.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0.5,100,10\n0.1,200,20\n")
    wl = tmp_path / "w.yaml"
    wl.write_text("name: replay\ntrace: {path: run.csv}\n")
    spec = load_workload(str(wl))
    arrays = generate_requests(spec, None, 10)
    assert arrays.arrival_s == [0.1, 0.5] and arrays.input_tokens == [200, 100]
    assert spec.input_stats().mean == 150


def test_workload_errors():
    with pytest.raises(ValueError):
        WorkloadSpec.model_validate({"name": "x", "input_tokens": {"kind": "fixed", "tokens": 5}})
    with pytest.raises(ConfigError, match="unknown workload"):
        load_workload("nope")
    with pytest.raises(ConfigError, match="give a rate"):
        generate_requests(load_workload("seed004"), None, 5)

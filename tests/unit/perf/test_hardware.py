import pytest

from trtpd.catalog import get_model
from trtpd.errors import ConfigError
from trtpd.perf.hardware import hardware_names, load_hardware, save_hardware
from trtpd.perf.measured import DecodeGrid, MeasuredProfile, PrefillCurve
from trtpd.perf.model import instance_perf


def test_shipped_profiles_load_with_sources():
    assert {"h100-sxm", "h200", "a100-80g", "cpu-reference"} <= set(hardware_names())
    for name in ("h100-sxm", "h200", "a100-80g"):
        hw = load_hardware(name)
        assert hw.sources, name
        assert hw.hbm_bandwidth_bytes_per_s > 1e12 and hw.nvlink_bandwidth_bytes_per_s > 0
    assert load_hardware("h200").memory_gb == 141
    assert load_hardware("h200").hbm_bandwidth_bytes_per_s > load_hardware("h100-sxm").hbm_bandwidth_bytes_per_s
    assert not load_hardware("a100-80g").supports_fp8


def test_unknown_hardware_lists_known_names():
    with pytest.raises(ConfigError, match="h100-sxm"):
        load_hardware("tpu-v9")


def test_bad_field_names_file_and_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmemory_gb: -1\npeak_flops_per_s: {bf16: 1e12}\nhbm_bandwidth_bytes_per_s: 1e12\n"
                   "nvlink_bandwidth_bytes_per_s: 0\nnetwork_bandwidth_bytes_per_s: 1e9\n")
    with pytest.raises(ConfigError) as err:
        load_hardware(str(bad))
    assert str(bad) in str(err.value) and "memory_gb" in str(err.value)


def test_unknown_field_is_refused(tmp_path):
    bad = tmp_path / "typo.yaml"
    text = (load_hardware("h100-sxm").model_dump_json())
    import json
    data = json.loads(text)
    data["hbm_bandwith_bytes_per_s"] = 1.0   # typo
    import yaml
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="hbm_bandwith_bytes_per_s"):
        load_hardware(str(bad))


def _measured(model="tiny-llama") -> MeasuredProfile:
    return MeasuredProfile(
        model=model, tp=1, kv_dtype="fp16", kv_capacity_tokens=50_000,
        prefill=PrefillCurve(num_tokens=[64, 512, 2048], latency_s=[0.01, 0.05, 0.2]),
        decode=DecodeGrid(batch_sizes=[1, 8], context_lens=[128, 1024],
                          step_latency_s=[[0.005, 0.006], [0.010, 0.014]]))


def test_measured_profile_round_trips_and_is_preferred(tmp_path):
    hw = load_hardware("cpu-reference").model_copy(update={"measured": [_measured()]})
    path = tmp_path / "cpu.yaml"
    save_hardware(hw, path)
    loaded = load_hardware(str(path))
    assert loaded.measured == hw.measured
    inst = instance_perf(get_model("tiny-llama"), loaded, tp=1, weight_dtype="fp32", kv_dtype="fp16")
    assert inst.source == "measured"
    assert inst.kv_capacity_tokens == 50_000
    assert inst.perf.prefill_s(512) == pytest.approx(0.05)
    assert inst.perf.prefill_s(1280) == pytest.approx(0.125)
    assert inst.perf.decode_step_s(8, 8 * 1024) == pytest.approx(0.014)
    assert inst.perf.decode_step_s(4, 4 * 576) == pytest.approx((0.0055 * 4 + 0.012 * 3) / 7)
    # another model, TP or KV dtype falls back to the roofline
    assert instance_perf(get_model("tiny-llama"), loaded, 1, "fp32", "fp8").source == "roofline"


def test_measured_profile_validation():
    with pytest.raises(ValueError):
        PrefillCurve(num_tokens=[512, 64], latency_s=[0.1, 0.2])
    with pytest.raises(ValueError):
        DecodeGrid(batch_sizes=[1, 2], context_lens=[1], step_latency_s=[[0.1]])

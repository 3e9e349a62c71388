"""The twin reads trtllm-serve's command line and LLM API YAML: what it uses, refuses and names as ignored."""

from __future__ import annotations

import pytest

from trtpd.catalog import KvDtype
from trtpd.errors import ConfigError
from trtpd.serve_twin.__main__ import check_engine, engine_folder
from trtpd.serve_twin.options import NO_TIMEOUT_MS, llm_api_options, parse_args


def test_trtllm_serve_defaults_hold_without_flags():
    """serve.py: --host localhost, --port 8000, --backend pytorch; no role serves both phases."""
    opts = parse_args(["/models/x"])
    assert (opts.host, opts.port, opts.backend, opts.server_role, opts.role) == \
        ("localhost", 8000, "pytorch", None, "colocated")
    assert opts.kv_transfer_timeout_ms is None and opts.cluster is None and opts.ignored == ()


def test_roles_gpu_flags_and_the_yaml(tmp_path):
    yaml_file = tmp_path / "ctx.yaml"
    yaml_file.write_text("cache_transceiver_config:\n  backend: NIXL\n  max_tokens_in_buffer: 8192\n"
                         "  kv_transfer_timeout_ms: 5000\nkv_cache_config:\n  dtype: fp8\n  tokens_per_block: 64\n"
                         "  free_gpu_memory_fraction: 0.2\ndisable_overlap_scheduler: true\n"
                         "enable_iter_perf_stats: true\n")
    opts = parse_args(["/m", "--server_role", "context", "--twin_key_file", str(tmp_path / "k"), "--tp_size", "2",
                       "--kv_cache_free_gpu_memory_fraction", "0.5", "--backend", "tensorrt",
                       "--extra_llm_api_options", str(yaml_file)])
    assert (opts.server_role, opts.role) == ("CONTEXT", "prefill")
    assert (opts.kv_transport, opts.kv_transfer_timeout_ms, opts.kv_dtype, opts.tokens_per_block,
            opts.iter_perf_stats) == ("tcp", 5000, "fp8", 64, True)
    assert set(opts.ignored) == {"--tp_size", "--kv_cache_free_gpu_memory_fraction", "--backend tensorrt",
                                 "cache_transceiver_config.max_tokens_in_buffer",
                                 "kv_cache_config.free_gpu_memory_fraction", "disable_overlap_scheduler"}
    assert parse_args(["/m", "--server_role", "GENERATION", "--twin_key_file", "k"]).role == "decode"


@pytest.mark.parametrize("data, field", [
    ({"cache_transceiver_config": {"backend": "ROCE"}}, "cache_transceiver_config.backend"),
    ({"cache_transceiver_config": {"kv_transfer_timeout_ms": -5}}, "cache_transceiver_config.kv_transfer_timeout_ms"),
    ({"kv_cache_config": {"tokens_per_block": "32"}}, "kv_cache_config.tokens_per_block"),
    ({"kv_cache_config": [1]}, "kv_cache_config"),
    ({"enable_iter_perf_stats": "yes"}, "enable_iter_perf_stats"),
    ({"return_perf_metrics": 1}, "return_perf_metrics"),
    ({"perf_metrics_max_requests": -1}, "perf_metrics_max_requests"),
    ({"disagg_cluster": {"cluster_uri": "http://h:1", "heartbeat": 3}}, "disagg_cluster.heartbeat"),
    ({"disagg_cluster": {"cluster_uri": 5}}, "cluster_uri"),
])
def test_a_bad_yaml_value_is_refused_by_its_name(data, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        llm_api_options(data, "ctx.yaml")


def test_the_cluster_comes_from_the_yaml_and_the_flag_overrides_its_uri(tmp_path):
    """serve.py pops a top-level disagg_cluster from the YAML; --disagg_cluster_uri overrides its cluster_uri."""
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("disagg_cluster:\n  cluster_uri: http://a:1\n  cluster_name: prod\n"
                         "  heartbeat_interval_sec: 2\n")
    opts = parse_args(["/m", "--server_role", "GENERATION", "--twin_key_file", "k", "--extra_llm_api_options",
                       str(yaml_file), "--disagg_cluster_uri", "http://b:2"])
    assert (opts.cluster.cluster_uri, opts.cluster.cluster_name, opts.cluster.heartbeat_interval_sec,
            opts.cluster.inactive_timeout_sec) == ("http://b:2", "prod", 2.0, 10.0)
    assert "disagg_cluster" not in opts.ignored


def test_the_cluster_uri_may_come_from_the_flag_alone(tmp_path):
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("disagg_cluster:\n  cluster_name: prod\n")
    base = ["/m", "--server_role", "CONTEXT", "--twin_key_file", "k", "--extra_llm_api_options", str(yaml_file)]
    assert parse_args(base + ["--disagg_cluster_uri", "http://r:1"]).cluster.cluster_uri == "http://r:1"
    with pytest.raises(ConfigError, match="no cluster_uri"):
        parse_args(base)


def test_a_cluster_needs_a_role_and_a_role_needs_the_key():
    with pytest.raises(ConfigError, match="--server_role is required"):
        parse_args(["/m", "--disagg_cluster_uri", "http://a:1"])
    with pytest.raises(ConfigError, match="--twin_key_file"):
        parse_args(["/m", "--server_role", "CONTEXT"])


def test_perf_metrics_are_kept_only_with_both_keys(tmp_path):
    """openai_server.py keeps /perf_metrics records only when return_perf_metrics is on and
    perf_metrics_max_requests > 0 (the deque's length)."""
    for yaml_text, kept in (("return_perf_metrics: true\nperf_metrics_max_requests: 10\n", 10),
                            ("perf_metrics_max_requests: 10\n", 0), ("return_perf_metrics: true\n", 0)):
        (tmp_path / "o.yaml").write_text(yaml_text)
        assert parse_args(["model", "--extra_llm_api_options", str(tmp_path / "o.yaml")]).perf_metrics_max_requests \
            == kept


def test_an_unset_kv_transfer_timeout_is_no_timeout_as_in_1_2_1():
    assert llm_api_options({}).kv_transfer_timeout_ms is None
    assert NO_TIMEOUT_MS >= 24 * 3600 * 1000


def test_the_engine_folder_is_found_from_the_build_or_its_checkpoint(fp16_root):
    assert engine_folder(fp16_root, "prefill") == fp16_root / "prefill-tp1"
    assert engine_folder(fp16_root / "checkpoint", "decode") == fp16_root / "decode-tp1"
    with pytest.raises(ConfigError, match="no prefill engine"):
        engine_folder(fp16_root.parent, "prefill")


def test_a_yaml_kv_layout_other_than_the_engines_is_refused(fp16_root):
    from trtpd.engine.engine_config import EngineConfig
    config = EngineConfig.load(fp16_root / "decode-tp1")
    assert config.kv_dtype is KvDtype.FP16
    check_engine(parse_args(["/m"]), config)
    with pytest.raises(ConfigError, match="kv_cache_config.dtype 'fp8' differs"):
        check_engine(parse_args(["/m"]).__class__(model=fp16_root, kv_dtype="fp8"), config)
    with pytest.raises(ConfigError, match="tokens_per_block 64 differs"):
        check_engine(parse_args(["/m"]).__class__(model=fp16_root, tokens_per_block=64), config)

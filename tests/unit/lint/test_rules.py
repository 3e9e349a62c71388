"""Every lint rule fires on a broken input and stays quiet on a good one.

CASES maps each rule in trtpd.lint.RULES to (fire, quiet): functions of a context that return
findings. test_every_rule_has_cases keeps the table complete when a rule is added.
"""

from __future__ import annotations

import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

from trtpd.lint import (RULES, lint_engine_pair, lint_model_configs, lint_ports, lint_repository,
                        lint_serve_configs)
from trtpd.lint.repository import launch_world_size
from trtpd.lint.serve_configs import lint_serve_launch
from trtpd.schema.manifest import StepRecord


@dataclass
class Ctx:
    make: object
    tmp: Path
    deploy: Path

    def pair(self, prefill: dict | None = None, decode: dict | None = None, **kw):
        p = self.make.manifest("prefill", **(prefill or {}))
        d = self.make.manifest("decode", **(decode or {}))
        return lint_engine_pair(p, d, **kw)

    def serve(self, prefill: dict | None = None, decode: dict | None = None, router: dict | None = None):
        return lint_serve_configs(prefill or self.make.serve_options("prefill"),
                                  decode or self.make.serve_options("decode"),
                                  router or self.make.router(), max_prompt_tokens=2048)

    def pytorch(self, prefill: dict | None = None, decode: dict | None = None, router: dict | None = None):
        """serve-pytorch/'s configs: the PyTorch backend's rules and the disagg_cluster agreement."""
        return lint_serve_configs(prefill or self.make.pytorch_options("prefill"),
                                  decode or self.make.pytorch_options("decode"),
                                  router or self.make.cluster_router(), max_prompt_tokens=2048, backend="pytorch")

    def repo(self, edits: list[tuple[str, str, str]] = (), launch_edit: tuple[str, str] | None = None):
        work = self.tmp / "deploy"
        if not work.exists():
            shutil.copytree(self.deploy, work)
        for model, old, new in edits:
            self.make.edit(work / "model_repository" / model / "config.pbtxt", old, new)
        if launch_edit:
            self.make.edit(work / "launch_triton.sh", *launch_edit)
        return lint_repository(work / "model_repository", launch_script=work / "launch_triton.sh")


    def repo_configs(self, edits: list[tuple[str, str, str]] = (), **manifests):
        """The rendered configs (edited in memory) linted with stand-in engine manifests."""
        configs = {d.name: (d / "config.pbtxt").read_text() for d in (self.deploy / "model_repository").iterdir()}
        for model, old, new in edits:
            assert old in configs[model], f"{old!r} not in {model}"
            configs[model] = configs[model].replace(old, new, 1)
        return lint_model_configs(configs, manifests={k: self.make.manifest(k, **v) for k, v in manifests.items()})

    def fp8_engine(self, *flags: str):
        argv = ["trtllm-build", "--checkpoint_dir", "c", "--gemm_plugin", "disable", *flags]
        m = self.make.manifest("decode")
        return m.model_copy(update={"inputs": m.inputs.model_copy(update={"quantization": "fp8"}),
                                    "steps": [StepRecord(name="trtllm-build", argv=argv, output_dir="e")]})


def _occupied_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock


def _ports_fire(c: Ctx):
    sock = _occupied_port()
    try:
        busy = sock.getsockname()[1]
        return lint_ports({"http": 18000, "grpc": 18000, "metrics": busy}, check_free=True)
    finally:
        sock.close()


def _no_reuse_key(c: Ctx):
    opts = c.make.serve_options("prefill")
    del opts["kv_cache_config"]["enable_block_reuse"]
    return c.serve(prefill=opts)


_CHUNKED_ON = 'key: "enable_chunked_context"\n  value: {\n    string_value: "true"'
_CHUNKED_OFF = 'key: "enable_chunked_context"\n  value: {\n    string_value: "false"'

CASES = {
    "kv-dtype": (lambda c: c.pair(decode={"kv_dtype": "fp16"}), lambda c: c.pair()),
    "tokens-per-block": (lambda c: c.pair(decode={"tokens_per_block": 64}), lambda c: c.pair()),
    "num-layers": (lambda c: c.pair(decode={"shape": {"num_layers": 40}}), lambda c: c.pair()),
    "num-kv-heads": (lambda c: c.pair(decode={"shape": {"num_kv_heads": 64}}), lambda c: c.pair()),
    "head-size": (lambda c: c.pair(decode={"shape": {"head_size": 64}}), lambda c: c.pair()),
    "kv-scales": (lambda c: c.pair(prefill={"scales": "aaaa"}, decode={"scales": "bbbb"}),
                  lambda c: c.pair(prefill={"scales": "aaaa"}, decode={"scales": "aaaa"})),
    "kv-scales-unverified": (lambda c: c.pair(prefill={"checkpoint": "fp8-tp2", "scales": "aaaa"},
                                              decode={"checkpoint": "fp8-tp4"}),
                             lambda c: c.pair(prefill={"checkpoint": "fp8-tp4"}, decode={"checkpoint": "fp8-tp4"})),
    "beam-width": (lambda c: c.pair(decode={"max_beam_width": 4}), lambda c: c.pair()),
    "prefill-input-len": (lambda c: c.pair(max_prompt_tokens=3000, max_output_tokens=0,
                                           decode={"max_input_len": 3000, "max_seq_len": 3000}),
                          lambda c: c.pair(max_prompt_tokens=2048)),
    "decode-input-len": (lambda c: c.pair(decode={"max_input_len": 1024, "max_seq_len": 1536}),
                         lambda c: c.pair(decode={"max_input_len": 2048, "max_seq_len": 2560})),
    "engine-status": (lambda c: c.pair(decode={"status": "failed"}), lambda c: c.pair()),
    "transceiver-backend": (lambda c: c.serve(decode=c.make.serve_options("decode", backend=None)), lambda c: c.serve()),
    "transfer-buffer": (lambda c: c.serve(decode=c.make.serve_options("decode", max_tokens_in_buffer=1024)),
                        lambda c: c.serve()),
    "transfer-timeout": (lambda c: c.serve(prefill=c.make.serve_options("prefill", kv_transfer_timeout_ms=None)),
                         lambda c: c.serve()),
    "context-kv-reuse": (_no_reuse_key, lambda c: c.serve()),
    "router-instances": (lambda c: c.serve(router=c.make.router(context_servers={"num_instances": 2})),
                         lambda c: c.serve()),
    "mpi-world": (lambda c: c.repo(launch_edit=(" \\\n    : -n 1", " \\\n    : -n 2")), lambda c: c.repo()),
    "participant-ids": (lambda c: c.repo([("decode", 'string_value: "3,4,5,6"', 'string_value: "2,3,4,5"')]),
                        lambda c: c.repo()),
    "placeholders": (lambda c: c.repo([("disagg_bls", '"decode"', '"${generation_model_name}"')]),
                     lambda c: c.repo()),
    "model-name-folder": (lambda c: c.repo([("decode", 'name: "decode"', 'name: "generation"')]),
                          lambda c: c.repo()),
    "model-config": (lambda c: c.repo([("prefill", "max_batch_size: 256", "max_batch_size: many")]),
                     lambda c: c.repo()),
    "ports": (_ports_fire, lambda c: lint_ports({"http": 18000, "grpc": 18001}, check_free=False)),
    "backend-parameters": (lambda c: c.repo([("decode", 'key: "tokenizer_dir"', 'key: "tokenizer_path"')]),
                           lambda c: c.repo()),
    "decode-num-tokens": (lambda c: c.repo_configs([("decode", _CHUNKED_ON, _CHUNKED_OFF)],
                                                   decode={"max_num_tokens": 256}),
                          lambda c: c.repo_configs(decode={"max_num_tokens": 256})),
    "multiple-profiles": (lambda c: lint_engine_pair(c.make.manifest("prefill"), c.fp8_engine()),
                          lambda c: lint_engine_pair(c.make.manifest("prefill"),
                                                     c.fp8_engine("--multiple_profiles", "enable"))),
    "ucx-env": (lambda c: lint_serve_launch("exec trtllm-serve disaggregated -c disagg.yaml\n", source="launch.sh"),
                lambda c: lint_serve_launch("export UCX_MEMTYPE_CACHE=${UCX_MEMTYPE_CACHE:-n}\n"
                                            "export UCX_CUDA_IPC_ENABLE_MNNVL=n\n", source="launch.sh")),
    "mpi-transfer-limits": (lambda c: c.repo(), lambda c: c.pair()),
    "tokenizer": (lambda c: lint_serve_launch("trtllm-serve /e --tokenizer meta-llama/Llama-2-70b-hf --port 1 &\n",
                                              source="l.sh"),
                  lambda c: lint_serve_launch("trtllm-serve /e --tokenizer /e/deploy/tokenizer --port 1 &\n",
                                              source="l.sh")),
    "context-overlap-scheduler": (
        lambda c: c.pytorch(prefill=c.make.pytorch_options("prefill", disable_overlap_scheduler=False)),
        lambda c: c.pytorch()),
    "iter-perf-stats": (lambda c: c.pytorch(decode={k: v for k, v in c.make.pytorch_options("decode").items()
                                                    if k != "enable_iter_perf_stats"}),
                        lambda c: c.pytorch()),
    "disagg-cluster": (lambda c: c.pytorch(decode=c.make.pytorch_options("decode", cluster={"cluster_name": "other"})),
                       lambda c: c.pytorch()),
    "transfer-timeout-scope": (
        lambda c: lint_serve_launch("trtllm-serve /e --backend tensorrt --port 8100 > p.log 2>&1 &\n", source="l.sh"),
        lambda c: lint_serve_launch("trtllm-serve /ckpt --backend pytorch --port 8100 > p.log 2>&1 &\n", source="l.sh")),
}


def test_every_rule_has_cases():
    assert set(CASES) == set(RULES)


@pytest.fixture
def ctx(make, tmp_path, gpu_deploy) -> Ctx:
    return Ctx(make, tmp_path, gpu_deploy)


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_fires(rule, ctx):
    findings = CASES[rule][0](ctx)
    fired = [f for f in findings if f.rule == rule]
    assert fired, f"{rule} did not fire; got {[f.format() for f in findings]}"
    for f in fired:
        assert f.message and f.fix and f.subject


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_quiet(rule, ctx):
    findings = CASES[rule][1](ctx)
    assert not [f for f in findings if f.rule == rule], [f.format() for f in findings]


# keys the 1.2.1 backend reads with no fallback, for hand-written configs
REQUIRED = "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in
                   (("gpt_model_type", "inflight_fused_batching"), ("tokenizer_dir", ""),
                    ("guided_decoding_backend", ""), ("xgrammar_tokenizer_info_path", "")))


def faults(findings):
    """Errors and warnings; the mpi-transfer-limits note is on every Triton repository."""
    return [f for f in findings if f.severity != "info"]


def test_kv_reuse_on_context_model_of_repository_fires(ctx):
    findings = ctx.repo([("prefill", 'key: "enable_kv_cache_reuse"\n  value: {\n    string_value: "false"',
                          'key: "enable_kv_cache_reuse"\n  value: {\n    string_value: "true"')])
    assert [f.rule for f in faults(findings)] == ["context-kv-reuse"]


def test_kv_reuse_on_decode_model_is_allowed(ctx):
    findings = ctx.repo([("decode", 'key: "enable_kv_cache_reuse"\n  value: {\n    string_value: "false"',
                          'key: "enable_kv_cache_reuse"\n  value: {\n    string_value: "true"')])
    assert faults(findings) == []


def test_generated_deployment_is_clean(ctx):
    findings = ctx.repo()
    assert faults(findings) == []
    assert [f.rule for f in findings] == ["mpi-transfer-limits"]
    assert "no KV-transfer timeout" in findings[0].message and "restart launch_triton.sh" in findings[0].fix
    assert "TRTLLM_KVCACHE_TRANSFER_BUFFER_SIZE" in findings[0].message        # a buffer setting does exist
    assert "use the trtllm-serve path" not in findings[0].fix                   # its engines ignore the timeout too


def test_missing_no_fallback_parameter_names_model_and_parameter(ctx):
    findings = ctx.repo([("decode", 'key: "xgrammar_tokenizer_info_path"', 'key: "xgrammar_tokenizer_info_path_x"')])
    fired = [f for f in faults(findings) if f.rule == "backend-parameters"]
    assert len(fired) == 1
    assert "model 'decode' lacks parameter 'xgrammar_tokenizer_info_path'" in fired[0].message
    assert "getGuidedDecodingConfigFromParams" in fired[0].message


def test_participant_groups_must_match_engine_tp(make, tmp_path):
    """Group size is checked against the engine manifest that gpt_model_path points to."""
    from trtpd.schema.manifest import write_manifest
    engine = tmp_path / "prefill-tp4"
    write_manifest(make.manifest("prefill", tp_size=4), engine)
    text = (f'name: "prefill"\nbackend: "tensorrtllm"\nmax_batch_size: 4\n'
            f'instance_group [ {{ count: 1 kind: KIND_CPU }} ]\n'
            f'parameters {{ key: "gpt_model_path" value: {{ string_value: "{engine}" }} }}\n'
            f'parameters {{ key: "enable_kv_cache_reuse" value: {{ string_value: "false" }} }}\n'
            f'parameters {{ key: "participant_ids" value: {{ string_value: "1,2" }} }}\n' + REQUIRED)
    findings = faults(lint_model_configs({"prefill": text}))
    assert [f.rule for f in findings] == ["participant-ids"]
    assert "TP*PP = 4" in findings[0].message


def test_rank_zero_and_gaps_are_reported(make):
    def model(name, ids):
        return (f'name: "{name}"\nbackend: "tensorrtllm"\nmax_batch_size: 4\n'
                f'parameters {{ key: "enable_kv_cache_reuse" value: {{ string_value: "false" }} }}\n'
                f'parameters {{ key: "participant_ids" value: {{ string_value: "{ids}" }} }}\n' + REQUIRED)
    findings = faults(lint_model_configs({"prefill": model("prefill", "0"), "decode": model("decode", "3")}))
    rules = sorted(f.rule for f in findings)
    assert rules == ["mpi-world", "participant-ids"]


def test_launch_world_size_counts_every_app_context():
    script = "exec mpirun --allow-run-as-root \\\n    -n 1 a \\\n    : -n 2 b \\\n    : -n 1 c\n"
    assert launch_world_size(script) == 4
    assert launch_world_size("trtllm-serve disaggregated -c x") is None


def test_decode_num_tokens_on_serve_configs(ctx):
    decode = ctx.make.serve_options("decode")
    fired = lint_serve_configs(ctx.make.serve_options("prefill"), decode, None, max_prompt_tokens=2048,
                               decode_max_num_tokens=256)
    assert [f.rule for f in fired] == ["decode-num-tokens"]
    decode["enable_chunked_prefill"] = True
    assert lint_serve_configs(ctx.make.serve_options("prefill"), decode, None, max_prompt_tokens=2048,
                              decode_max_num_tokens=256) == []


def test_transfer_buffer_equal_to_the_longest_prompt_is_an_error(ctx):
    fired = ctx.serve(decode=ctx.make.serve_options("decode", max_tokens_in_buffer=2048))
    assert [(f.rule, f.severity) for f in fired] == [("transfer-buffer", "error")]
    assert "equal to the longest prompt" in fired[0].message


def test_mismatched_kv_scales_fail_the_pair_naming_the_field(make):
    """Two calibrations (TP2 prefill, TP4 decode) whose FP8 KV scales differ: an error on kv_scales_digest, which
    render and the fleet launcher refuse on (check_pair)."""
    p = make.manifest("prefill", tp_size=2, checkpoint="ckpt/fp8-tp2", scales="1111aaaa2222bbbb")
    d = make.manifest("decode", tp_size=4, checkpoint="ckpt/fp8-tp4", scales="3333cccc4444dddd")
    (finding,) = [f for f in lint_engine_pair(p, d) if f.severity == "error"]
    assert (finding.rule, finding.subject) == ("kv-scales", "kv_scales_digest")
    assert finding.message.startswith("kv_scales_digest differs: prefill prefill-tp2 has 1111aaaa2222bbbb, decode "
                                      "decode-tp4 has 3333cccc4444dddd")


def test_kv_scales_of_planned_and_fp16_engines_are_not_required(make):
    two = {"prefill": {"checkpoint": "a"}, "decode": {"checkpoint": "b"}}
    planned = lint_engine_pair(make.manifest("prefill", status="planned", **two["prefill"]),
                               make.manifest("decode", status="planned", **two["decode"]))
    fp16 = lint_engine_pair(make.manifest("prefill", kv_dtype="fp16", **two["prefill"]),
                            make.manifest("decode", kv_dtype="fp16", **two["decode"]))
    assert not [f for f in planned + fp16 if f.rule.startswith("kv-scales")]


def test_written_repository_without_its_tokenizer_fails_the_deployment_lint(gpu_deploy, tmp_path):
    from trtpd.lint.deployment import lint_tokenizer_dirs
    work = tmp_path / "deploy"
    shutil.copytree(gpu_deploy, work)
    missing = lint_tokenizer_dirs(work / "model_repository")
    assert [(f.rule, f.severity) for f in missing] == [("tokenizer", "error")] * 2
    assert missing[0].message.endswith("/deploy/tokenizer/tokenizer.json does not exist")
    tokenizer = Path(missing[0].message.split("/tokenizer.json")[0])
    assert tokenizer.name == "tokenizer" and tokenizer.parent.name == "deploy"


# --- the PyTorch backend's servers (serve-pytorch/) and their disagg_cluster ---------------------------------------


def rules_of(findings, severity: str | None = None):
    return [f.rule for f in findings if severity is None or f.severity == severity]


@pytest.mark.parametrize("backend, severity", [("ucx", "error"), ("MOONCAKE", "error"), ("NIXL", None)])
def test_a_transceiver_backend_outside_1_2_1s_literals_is_refused(ctx, backend, severity):
    findings = ctx.pytorch(decode=ctx.make.pytorch_options("decode", cache_transceiver_config={
        "backend": backend, "max_tokens_in_buffer": 2080, "kv_transfer_timeout_ms": 60000}))
    fired = [f for f in findings if f.rule == "transceiver-backend"]
    assert [f.severity for f in fired] == ([severity] if severity else [])
    if backend == "ucx":
        assert "upper case" in fired[0].message and fired[0].fix == "set backend: UCX"


def test_kv_dtypes_that_differ_are_refused_and_one_left_to_the_checkpoint_is_a_warning(ctx):
    nvfp4 = ctx.pytorch(decode=ctx.make.pytorch_options("decode", kv={"dtype": "nvfp4"}))
    assert [(f.rule, f.severity) for f in nvfp4] == [("kv-dtype", "error")]
    assert "prefill fp8, decode nvfp4" in nvfp4[0].message
    auto = ctx.make.pytorch_options("decode")
    del auto["kv_cache_config"]["dtype"]
    assert [(f.rule, f.severity) for f in ctx.pytorch(decode=auto)] == [("kv-dtype", "warning")]


def test_tokens_per_block_that_differ_between_the_servers_are_refused(ctx):
    findings = ctx.pytorch(decode=ctx.make.pytorch_options("decode", kv={"tokens_per_block": 64}))
    assert [(f.rule, f.severity) for f in findings] == [("tokens-per-block", "error")]


def test_the_engine_paths_configs_get_no_pytorch_backend_rule(ctx):
    """Engine YAML carries no disable_overlap_scheduler or enable_iter_perf_stats (TrtLlmArgs has neither)."""
    assert ctx.serve() == []


@pytest.mark.parametrize("router_edit, message", [
    ({"cluster_uri": "http://localhost:9000"}, "is not this router (port 8000)"),
    ({"heartbeat_interval_sec": 10}, "sends no heartbeat and its registration expires 10 s after it joins"),
    ({"minimal": {"generation_servers": 0}}, "reports ready with no generation_servers"),
])
def test_a_router_cluster_that_cannot_work_is_refused(ctx, router_edit, message):
    minimal = router_edit.pop("minimal", None)
    findings = ctx.pytorch(router=ctx.make.cluster_router(minimal, **router_edit))
    fired = [f for f in findings if f.rule == "disagg-cluster" and message in f.message]
    assert fired and fired[0].subject.startswith("disagg.yaml: disagg_cluster"), [f.format() for f in findings]


def test_a_server_whose_cluster_differs_from_the_routers_is_refused(ctx):
    uri = ctx.pytorch(prefill=ctx.make.pytorch_options("prefill", cluster={"cluster_uri": "http://other:8000"}))
    assert rules_of(uri) == ["disagg-cluster"] and "overrides --disagg_cluster_uri" in uri[0].message
    name = ctx.pytorch(decode=ctx.make.pytorch_options("decode", cluster={"cluster_name": ""}))
    assert rules_of(name) == ["disagg-cluster"] and "/trtllm-disagg//workers" in name[0].message
    static = lint_serve_configs(ctx.make.pytorch_options("prefill"), ctx.make.pytorch_options("decode"),
                                ctx.make.router(), max_prompt_tokens=2048, backend="pytorch")
    assert rules_of(static) == ["disagg-cluster"] * 2 and "static urls" in static[0].message


def test_a_cluster_router_lists_no_urls_and_that_is_not_a_router_instances_fault(ctx):
    assert "router-instances" not in rules_of(ctx.pytorch())
    assert "router-instances" in rules_of(ctx.serve(router=ctx.make.router(context_servers={"num_instances": 2})))


def test_a_launch_flag_pointing_elsewhere_than_the_routers_cluster_is_refused(make):
    from trtpd.lint.disagg_cluster import lint_launch_cluster
    line = "trtllm-serve /ckpt --backend pytorch --server_role CONTEXT --disagg_cluster_uri {} &\n"
    router = make.cluster_router()
    assert lint_launch_cluster(line.format("http://localhost:8000"), router, source="l.sh") == []
    (wrong,) = lint_launch_cluster(line.format("http://localhost:8001"), router, source="l.sh")
    assert (wrong.rule, wrong.severity) == ("disagg-cluster", "error")
    assert wrong.fix == "pass --disagg_cluster_uri http://localhost:8000"


@pytest.mark.parametrize("script, backend", [
    ("trtllm-serve /e --backend tensorrt --port 1 &\nexec trtllm-serve disaggregated -c d.yaml\n", "tensorrt"),
    ("trtllm-serve /ckpt --backend pytorch --port 1 &\n", "pytorch"),
    ("trtllm-serve /ckpt --port 1 &\n", "pytorch"),                 # trtllm-serve's default backend
    ("exec trtllm-serve disaggregated -c d.yaml\n", None),
])
def test_the_backend_of_a_launch_script(script, backend):
    from trtpd.lint.serve_configs import serve_backend
    assert serve_backend(script) == backend

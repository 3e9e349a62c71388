"""The TensorRT-LLM 1.2.x options table, and every flag/key trtpd emits checked against it.

The emitted artifacts are parsed back from their text (commands, config.pbtxt, YAML, launch
scripts), so a flag added anywhere without a table entry fails here.
"""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from trtpd.trtllm.options import check_args, check_keys
from trtpd.trtllm.options_table import OPTIONS
from trtpd.trtllm.run import prepare
from trtpd.schema.pbtxt import parameters, parse_model_config

TYPES = {"int", "float", "bool", "switch", "flag", "enum", "str", "path", "list", "memsize"}
# owner/repo path..., pinned: @<commit> or (id N) of the stored version read
_UPSTREAM = r"^[\w-]+/[\w.-]+ \S+.*(@[0-9a-f]{7}|\bid \d+)"


def test_table_rows_are_complete():
    seen = set()
    for o in OPTIONS:
        assert (o.tool, o.name) not in seen, f"duplicate {o.tool} {o.name}"
        seen.add((o.tool, o.name))
        assert o.type in TYPES, o
        assert o.source.startswith("trtllm-1.2.md §") or re.match(_UPSTREAM, o.source), \
            f"{o.name}: source must cite trtllm-1.2.md, or an upstream file at a version (path@commit or id N)"
        if o.type in ("enum", "switch", "bool"):
            assert o.allowed, f"{o.name}: {o.type} needs allowed values"
        if o.default is not None and o.allowed and o.type != "flag":
            assert o.default in o.allowed, f"{o.name}: default {o.default} not allowed"


def test_check_args_rejects_unknown_deprecated_and_mistyped():
    problems = check_args("trtllm-build", [("--max_batch_size", "x"), ("--paged_kv_cache", "enable"),
                                           ("--kv_cache_type", "ring"), ("--no_such_flag", "1"),
                                           ("--tokens_per_block", "0")])
    text = "\n".join(problems)
    assert "--max_batch_size must be an int" in text
    assert "--paged_kv_cache must not be emitted" in text and "--kv_cache_type" in text
    assert "must be one of continuous, paged, disabled" in text
    assert "--no_such_flag is not a TensorRT-LLM 1.2.x option" in text
    assert "--tokens_per_block must be >= 1" in text
    assert check_args("quantize.py", [("--qformat", "fp8"), ("--qformat", "fp8")]) == ["quantize.py: --qformat given twice"]


def test_kv_token_cap_is_an_int32_or_empty():
    """max_tokens_in_paged_kv_cache: GetParameter<int32_t> (std::stoi) in a try/catch, so "" is unset."""
    def check(value):
        return check_keys("tensorrtllm-config", {"max_tokens_in_paged_kv_cache": value})
    assert check("") == [] and check("655360") == [] and check(2**31 - 1) == []
    assert check("0") == ["tensorrtllm-config max_tokens_in_paged_kv_cache must be >= 1, got 0"]
    assert check(2**31) == ["tensorrtllm-config max_tokens_in_paged_kv_cache must be <= 2147483647, got 2147483648"]
    assert check("64k") == ["tensorrtllm-config max_tokens_in_paged_kv_cache must be an int, got '64k'"]
    assert check_keys("tensorrtllm-config", {"max_beam_width": ""}) == [
        "tensorrtllm-config max_beam_width must be an int, got ''"]          # empty only where empty_ok


def test_check_keys_rejects_unknown_yaml_keys():
    problems = check_keys("llm-api-options", {"cache_transceiver_config": {"backend": "ucx", "buffer": 1}})
    assert any("must be one of DEFAULT, UCX, NIXL, MPI" in p for p in problems)       # case matters in 1.2.x
    assert any("'cache_transceiver_config.buffer' is not a TensorRT-LLM 1.2.x key" in p for p in problems)


def _flag_pairs(argv: list[str]) -> list[tuple[str, str | None]]:
    pairs, i = [], 0
    while i < len(argv):
        token = argv[i]
        if "=" in token and token.startswith("--"):
            flag, value = token.split("=", 1)
            pairs.append((flag, value))
        elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            pairs.append((token, argv[i + 1]))
            i += 1
        else:
            pairs.append((token, None))
        i += 1
    return pairs


def _tool_of(program: list[str]) -> tuple[str, list[str]]:
    if program[0] == "python3":
        return program[1].rsplit("/", 1)[-1], program[2:]
    if program[:2] == ["hf", "download"]:
        return "hf download", program[3:]           # skip the repository id
    if program[:2] == ["trtllm-serve", "disaggregated"]:
        return "trtllm-serve disaggregated", program[2:]
    if program[0] == "trtllm-serve":
        return "trtllm-serve", program[2:]          # skip the engine folder argument
    return program[0], program[1:]


@pytest.mark.parametrize("case", ["llama-2-70b-tp2-tp4-fp8", "llama-3.1-8b-tp1-tp1-fp16"])
def test_every_emitted_flag_and_key_is_in_the_table(case, golden_cases, request_for):
    model, overrides = golden_cases[case]
    prepared = prepare(request_for(model, **overrides))
    problems, checked = [], 0
    for step in prepared.plan.unique_steps():                       # commands, parsed from the shell text
        tool, rest = _tool_of(shlex.split(step.shell()))
        problems += check_args(tool, _flag_pairs(rest))
        checked += 1
    for name in ("prefill", "decode"):                              # config.pbtxt parameters + backend
        config = parse_model_config(prepared.configs[name], name)
        problems += check_keys("tensorrtllm-config", {"backend": config.backend, **parameters(config)})
    files = prepared.deploy.files
    for name in ("prefill", "decode"):
        problems += check_keys("llm-api-options", yaml.safe_load(files[f"trtllm-serve/{name}.yaml"]))
    problems += check_keys("disagg-config", yaml.safe_load(files["trtllm-serve/disagg.yaml"]))
    for line in files["trtllm-serve/launch.sh"].splitlines():
        if line.startswith("CUDA_VISIBLE_DEVICES=") or line.startswith("exec trtllm-serve"):
            tool, rest = _tool_of(shlex.split(line.split(" ", 1)[1].split(" > ")[0]))
            problems += check_args(tool, _flag_pairs(rest))
            checked += 1
    script = files["launch_triton.sh"].replace("\\\n", " ")
    mpirun = shlex.split(script[script.index("exec mpirun"):])[2:]
    apps = " ".join(mpirun).split(" : ")
    head, apps[0] = apps[0].split(" -n 1 ", 1)
    problems += check_args("mpirun", _flag_pairs(head.split()) + [("-n", "1")])
    for app in apps:
        tokens = app.replace("-n 1 ", "", 1).split()
        problems += check_args("tritonserver", _flag_pairs(tokens[1:]))
    problems += check_keys("env", dict(re.findall(r"^export (\w+)=(\S+)$", files["launch_triton.sh"], re.M)))
    assert problems == []
    assert checked >= 5


def _command_lines(script: str) -> list[str]:
    """The commands of a generated script: worker lines (their log redirection dropped), exec lines, step lines."""
    lines = []
    for line in script.splitlines():
        if line.startswith("CUDA_VISIBLE_DEVICES="):
            lines.append(line.split(" ", 1)[1].split(" > ")[0])
        elif line.startswith(("exec trtllm-serve", "python3 ", "hf download ")):
            lines.append(line.removeprefix("exec "))
    return lines


@pytest.mark.parametrize("case", ["llama-2-70b-tp2-tp4-fp8", "llama-3.1-8b-tp1-tp1-fp16"])
def test_every_emitted_pytorch_backend_flag_and_key_is_in_the_table(case, golden_cases, request_for):
    """serve-pytorch/, parsed back from its text: TorchLlmArgs keys, the router's disagg_cluster, every command."""
    model, overrides = golden_cases[case]
    files = prepare(request_for(model, **overrides)).deploy.files
    problems, checked = [], 0
    for name in ("prefill", "decode"):
        problems += check_keys("torch-llm-api-options", yaml.safe_load(files[f"serve-pytorch/{name}.yaml"]))
    problems += check_keys("disagg-config", yaml.safe_load(files["serve-pytorch/disagg.yaml"]))
    for script in ("launch.sh", "checkpoint.sh"):
        for line in _command_lines(files.get(f"serve-pytorch/{script}", "")):
            tool, rest = _tool_of(shlex.split(line))
            problems += check_args(tool, _flag_pairs(rest))
            checked += 1
    problems += check_keys("env", dict(re.findall(r"^export (\w+)=\$\{\w+:-(\S+)\}$", files["serve-pytorch/launch.sh"],
                                                  re.M)))
    assert problems == []
    assert checked == 4           # two servers, the router, the checkpoint step (hf_ptq.py, or hf download)


def test_a_key_1_2_1_lacks_or_a_tensorrt_only_key_is_refused_for_the_pytorch_backend():
    problems = check_keys("torch-llm-api-options", {
        "extended_runtime_perf_knob_config": {"cuda_graph_mode": True},          # TrtLlmArgs only
        "cache_transceiver_config": {"backend": "MOONCAKE", "transceiver_runtime": "PYTHON"},   # after the 1.2 cut
        "kv_cache_config": {"dtype": "fp16"}})
    text = "\n".join(problems)
    assert "'extended_runtime_perf_knob_config.cuda_graph_mode' is not a TensorRT-LLM 1.2.x key" in text
    assert "must be one of DEFAULT, UCX, NIXL, MPI; got 'MOONCAKE'" in text
    assert "'cache_transceiver_config.transceiver_runtime' is not a TensorRT-LLM 1.2.x key" in text
    assert "kv_cache_config.dtype must be one of auto, fp8, nvfp4; got 'fp16'" in text
    assert check_args("trtllm-serve", [("--server_role", "PREFILL")]) == [
        "trtllm-serve --server_role must be one of CONTEXT, GENERATION, MM_ENCODER; got 'PREFILL'"]
    assert check_keys("disagg-config", {"disagg_cluster": {"inactive_interval_sec": 10}}) == [
        "disagg-config: key 'disagg_cluster.inactive_interval_sec' is not a TensorRT-LLM 1.2.x key trtpd knows "
        "(see trtpd/trtllm/options_table.py)"]       # the README's misspelling: DisaggClusterConfig raises KeyError


def test_backend_parameter_table_names_the_reader_of_each_key():
    from trtpd.trtllm.options_table import BACKEND_PARAMETERS, required_backend_parameters
    names = [p.name for p in BACKEND_PARAMETERS]
    assert len(names) == len(set(names))
    for p in BACKEND_PARAMETERS:
        assert p.reader.split("::")[0] in ("model_instance_state.cc", "model_state.cc"), p
        assert "::" in p.reader and p.reader.split("::")[-1], p
        assert p.has_fallback == bool(p.fallback), f"{p.name}: a fallback value iff it has one"
    assert set(required_backend_parameters()) == {"gpt_model_type", "tokenizer_dir", "guided_decoding_backend",
                                                  "xgrammar_tokenizer_info_path"}


def test_every_no_fallback_parameter_is_a_key_trtpd_emits(request_for):
    from trtpd.trtllm.gpu_repo import role_parameters
    from trtpd.trtllm.mpi_world import plan_mpi_world
    from trtpd.trtllm.options_table import required_backend_parameters
    from trtpd.trtllm.plan import plan_build
    plan = plan_build(request_for(prefill_tp=2, decode_tp=4))
    for role in plan.roles:
        params = role_parameters(plan, role, plan_mpi_world(plan.request))
        assert set(required_backend_parameters()) <= set(params)
        assert [params[k] for k in ("tokenizer_dir", "guided_decoding_backend", "xgrammar_tokenizer_info_path")] == \
            ["", "", ""]

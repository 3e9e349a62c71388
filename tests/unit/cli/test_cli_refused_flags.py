"""A flag the chosen mode cannot use is refused with one line, not silently ignored."""

from __future__ import annotations

import pytest

REFUSED = [
    (["plan", "--rate-per-s", "5", "--decode-batch", "30"],
     "trtpd plan: error: --decode-batch: only used by --method seed004"),
    (["plan", "--rate-per-s", "5", "--overhead-s", "0.2", "--tp-prefill-max", "1000"],
     "trtpd plan: error: --tp-prefill-max, --overhead-s: only used by --method seed004"),
    (["plan", "--method", "seed004", "--tokens-per-min", "5e6", "--max-gpus", "8"],
     "trtpd plan: error: --max-gpus: not used by --method seed004 (it takes --slo/--ttft-s, --tokens-per-min, "
     "--input-tokens, --output-tokens and the seed004 group)"),
    (["build", "--backend", "reference", "--model", "tiny-llama", "--configs-only"],
     "trtpd build: error: --configs-only: only used by --backend tensorrtllm"),
    (["build", "--backend", "reference", "--model", "tiny-llama", "--dry-run", "--decode-max-batch-size", "8"],
     "trtpd build: error: --decode-max-batch-size: only used by --backend tensorrtllm"),
    (["build", "--backend", "reference", "--model", "tiny-llama", "--dry-run", "--modelopt-dir", "/opt/m"],
     "trtpd build: error: --modelopt-dir: only used by --backend tensorrtllm"),
    (["build", "--model", "llama-3.1-8b", "--no-fp8", "--dry-run", "--modelopt-dir", "/opt/m"],
     "trtpd build: error: --modelopt-dir /opt/m: only FP8 weights need ModelOpt's hf_ptq.py (without FP8 "
     "serve-pytorch/ serves the Hugging Face checkpoint as it is); drop --modelopt-dir or pass --fp8"),
    (["build", "--model", "llama-2-70b", "--dry-run", "--force"],
     "trtpd build: error: --force: a dry run writes nothing, so there is nothing to replace"),
    (["simulate", "--rate-per-s", "2", "--find-goodput", "--no-early-stop"],
     "trtpd simulate: error: --no-early-stop: --find-goodput always stops a run early once its queue grows"),
    (["up", "--mode", "colocated", "--prefill-instances", "2"],
     "trtpd up: error: --prefill-instances: not used by --mode colocated (give --colocated-instances)"),
    (["render", "-o", "r", "--colocated-instances", "3"],
     "trtpd render: error: --colocated-instances: not used by --mode disaggregated"),
    (["down", "--all", "--name", "x"], "trtpd down: error: --name: --all stops every deployment; give --name or --all"),
    (["lint", "--list-rules", "--repo", "x"],
     "trtpd lint: error: --repo: --list-rules lints nothing; drop one or the other"),
    (["bench", "--ttft-slo-ms", "100"],
     "trtpd bench: error: --ttft-slo-ms and --tpot-slo-ms: give both (SLO attainment needs both targets) or neither"),
]


@pytest.mark.parametrize("argv, line", REFUSED, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_unused_flag_is_refused(trtpd, argv, line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = trtpd(*argv)
    assert (code, err.splitlines()) == (2, [line])
    assert list(tmp_path.iterdir()) == []


def test_the_default_value_given_explicitly_is_still_refused(trtpd):
    code, _, err = trtpd("plan", "--rate-per-s", "5", "--decode-batch", "34")
    assert code == 2 and "--decode-batch: only used by --method seed004" in err


def test_search_uses_fixed_input_and_output_lengths(trtpd):
    base = trtpd("plan", "--rate-per-s", "5", "--no-verify", "--yaml")
    fixed = trtpd("plan", "--rate-per-s", "5", "--no-verify", "--yaml", "--input-tokens", "6144",
                  "--output-tokens", "512")
    assert base[0] == 0 and fixed[0] == 0
    assert "chat-powerlaw (fixed input 6144, output 512 tokens)" in fixed[1]
    assert "(fixed" not in base[1]
    assert fixed[1] != base[1].replace("chat-powerlaw", "chat-powerlaw (fixed input 6144, output 512 tokens)")


def test_seed004_still_takes_input_and_output_tokens(trtpd):
    code, out, _ = trtpd("plan", "--method", "seed004", "--tokens-per-min", "5e6", "--input-tokens", "3072",
                         "--tp-prefill-tokens-per-s", "25000")
    assert code == 0 and "TP_prefill = 28300 - 3072 / (2 - 0.1)" in out


def test_trace_workload_lengths_cannot_be_overridden(trtpd, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0.0,100,10\n0.5,200,20\n")
    workload = tmp_path / "w.yaml"
    workload.write_text(f"name: replay\ntrace: {{path: {trace}}}\n")
    code, _, err = trtpd("plan", "--rate-per-s", "1", "--no-verify", "--workload", str(workload),
                         "--input-tokens", "100")
    assert code == 2
    assert err.splitlines() == ["trtpd plan: error: --input-tokens: workload 'replay' replays a trace, whose lengths "
                                "cannot be overridden; pick a workload with length distributions"]

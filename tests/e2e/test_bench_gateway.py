"""`trtpd bench` and NVIDIA aiperf through a real 1P+1D fleet's OpenAI gateway (each role its own
tritonserver): the CLI writes the report, its plots and the JSON, every request reaches the gateway, and
aiperf runs offline with the checkpoint folder as its tokenizer (a Hugging Face tokenizer.json).

aiperf lives in its own environment (its dependencies are heavy and would move rich, pillow and
prometheus-client in .venv): TRTPD_AIPERF names the executable, default .venv-aiperf/bin/aiperf, then
/tmp/aiperf-venv/bin/aiperf (docs/aiperf.md says how to install it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from trtpd.deploy.spec import ReferenceDeployment

from .conftest import auth, fleet_with_gateway, gateway_key

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TRTPD = Path(sys.executable).parent / "trtpd"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FLEET = "bench-gw-1p1d"


@pytest.fixture(scope="module")
def fleet(trtpd_home, fp16_root):
    with fleet_with_gateway(FLEET, ReferenceDeployment(fp16_root), prefill=1, decode=1) as record:
        yield record


def gateway_completions(fleet) -> float:
    """trtpd_gateway_requests_total for /v1/completions answered 200."""
    text = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{fleet.gateway['port']}/metrics",
                                                         headers=auth(fleet)), timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith('trtpd_gateway_requests_total{endpoint="/v1/completions",status="200"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_trtpd_bench_through_the_gateway_writes_report_plots_and_json(fleet, tmp_path):
    workload = tmp_path / "tiny.yaml"
    workload.write_text("name: tiny\narrival: {process: poisson}\n"
                        "input_tokens: {kind: uniform, min_tokens: 16, max_tokens: 200}\n"
                        "output_tokens: {kind: fixed, tokens: 8}\n")
    url = f"http://127.0.0.1:{fleet.gateway['port']}/v1"
    before = gateway_completions(fleet)
    out = tmp_path / "out"
    cmd = [str(TRTPD), "bench", "--name", FLEET, "--compare", url, "--workload", str(workload),
           "--arrival", "gamma", "--cv", "2", "--rate", "4", "--num-requests", "5", "--ttft-slo-ms", "5000",
           "--tpot-slo-ms", "1000", "--report", str(out / "bench.md"), "--json", str(out / "bench.json"),
           "--trace", str(out / "trace.csv")]
    # the URL target's key comes from $OPENAI_API_KEY, as for any OpenAI client; the fleet's from its api.key
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200", "OPENAI_API_KEY": gateway_key(fleet)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # 2 targets x (1 warm-up + 5 measured), all through this gateway
    assert gateway_completions(fleet) - before == 12

    label = f"{FLEET} (disaggregated)"
    data = json.loads((out / "bench.json").read_text())
    assert [t["label"] for t in data["targets"]] == [label, f"127.0.0.1:{fleet.gateway['port']}"]
    assert data["arrival"] == {"process": "gamma", "cv": 2.0} and data["rates_per_s"] == [4.0]
    assert len(data["runs"]) == 2
    texts = []
    for run in data["runs"]:
        assert len(run["requests"]) == 5
        for r in run["requests"]:
            assert r["error"] is None and r["num_output_tokens"] == 8, r
            assert r["token_times_s"][0] > r["sent_s"] >= 0
        texts.append([r["text"] for r in run["requests"]])
    assert texts[0] == texts[1]                      # the same requests, greedy: the same text at both targets
    for s in data["summaries"]:
        assert s["summary"]["num_errors"] == 0 and s["summary"]["slo_attainment"] == 1.0
        assert s["goodput_requests_per_s"] == pytest.approx(4.0)
        assert 0 < s["summary"]["ttft_s"]["p50"] <= s["summary"]["ttft_s"]["p99"]
    assert data["goodput_rate_per_s"][label] == 4.0

    md = (out / "bench.md").read_text()
    assert "## 4 requests/s" in md and "Gamma (CV 2)" in md and f"| {label} | 4 | 100% |" in md
    for png in ("bench-rate-4-cdf.png", "bench-goodput.png"):
        blob = (out / png).read_bytes()
        assert blob.startswith(PNG_MAGIC) and len(blob) > 5000 and f"]({png})" in md
    trace = (out / "trace.csv").read_text().splitlines()
    assert trace[0].endswith("target,rate_per_s") and len(trace) == 11
    assert "goodput" in proc.stdout and "TTFT P99 (ms)" in proc.stdout


def aiperf_executable() -> Path:
    candidates = [os.environ.get("TRTPD_AIPERF"), REPO / ".venv-aiperf/bin/aiperf", "/tmp/aiperf-venv/bin/aiperf"]
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    raise AssertionError("aiperf is not installed: python3 -m venv .venv-aiperf && .venv-aiperf/bin/pip install "
                         "aiperf==0.13.0 (or set TRTPD_AIPERF to its executable); see docs/aiperf.md")


def test_aiperf_runs_offline_against_the_gateway_with_the_checkpoint_tokenizer(fleet, fp16_root, tmp_path):
    aiperf = aiperf_executable()
    hf = fp16_root / "checkpoint"
    # transformers' AutoTokenizer reads the checkpoint's tokenizer.json as it is and gives the reference
    # tokenizer's ids (checked with aiperf's own transformers)
    check = ("import json, sys; from transformers import AutoTokenizer; t = AutoTokenizer.from_pretrained(sys.argv[1]);"
             "print(json.dumps([t.encode(x) for x in json.loads(sys.argv[2])]))")
    from trtpd.engine import corpus
    from trtpd.engine.checkpoint import load_checkpoint
    texts = [corpus.text(12, seed=s) for s in range(10)] + ["naïve café, 日本語 🙂\n\n\ttabs  spaces"]
    ours = load_checkpoint(fp16_root / "checkpoint").load_tokenizer()
    theirs = subprocess.run([str(aiperf.parent / "python"), "-c", check, str(hf), json.dumps(texts)],
                            capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()[-1]
    assert json.loads(theirs) == [ours.encode(x) for x in texts]

    before = gateway_completions(fleet)
    art = tmp_path / "aiperf"
    cmd = [str(aiperf), "profile", "--model", "tiny-llama", "--url", f"http://127.0.0.1:{fleet.gateway['port']}",
           "--endpoint-type", "completions", "--streaming", "--tokenizer", str(hf), "--request-count", "8",
           "--api-key", gateway_key(fleet),
           "--concurrency", "2", "--isl", "32", "--isl-stddev", "0", "--osl", "8", "--osl-stddev", "0",
           "--use-server-token-count", "--random-seed", "0", "--ui-type", "none", "--no-server-metrics",
           "--extra-inputs", "ignore_eos:true",   # sampled (temperature 1): without it an early EOS shortens OSL
           "--no-gpu-telemetry", "--artifact-dir", str(art)]
    # not HF_HUB_OFFLINE=1: aiperf 0.13's offline path resolves every name as a hub repo (snapshot_download)
    # and refuses a local folder (HFValidationError); the online path loads the folder with no network use
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads((art / "profile_export_aiperf.json").read_text())
    assert result["request_count"]["avg"] == 8 and not result.get("error_summary"), result.get("error_summary")
    assert result["time_to_first_token"]["count"] == 8 and result["time_to_first_token"]["p50"] > 0
    assert result["inter_token_latency"]["p50"] > 0
    # server-reported counts: aiperf's 32-token prompts are 32 tokens for the gateway too (same tokenizer)
    assert result["input_sequence_length"]["avg"] == 32 and result["output_sequence_length"]["avg"] == 8
    assert gateway_completions(fleet) - before == 8

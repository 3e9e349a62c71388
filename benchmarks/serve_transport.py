"""The gateway's two transports side by side, on the same reference engines, in one run.

Two disaggregated 1P+1D fleets from the same engine folders: one of tritonservers (the gateway's Triton gRPC
transport) and one of trtllm-serve twin workers (its trtllm-serve HTTP transport). In turns (ABAB, so drift hits
both alike), the same short greedy requests go
  (a) through the transport alone, from this process: context_only to the prefill instance, then generation_only
      with its handle to the decode instance (what the orchestrator sends), and
  (b) through the fleet's gateway (/v1/completions, plain httpx, not streamed).
(b) - (a) is what the gateway adds on that transport (HTTP + JSON, tokenization, admission, routing,
detokenization); (a) for trtllm-serve against (a) for Triton is what the transport itself costs.

Then a generation worker started by hand joins the trtllm-serve fleet through the gateway's cluster storage
(--disagg_cluster_uri): the time from its registration to the gateway routing to it, and to its first request.

    .venv/bin/python benchmarks/serve_transport.py [--requests 100] [--engines engines]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


PHASES = ("prefill_queue", "prefill_compute", "kv_transfer", "decode_queue")


def breakdown(metrics_text: str) -> tuple[dict[str, float], dict[str, float], float]:
    """The gateway's TTFT breakdown histogram (sum and count per phase) and KV bytes, from its /metrics."""
    from prometheus_client.parser import text_string_to_metric_families
    sums, counts, kv_bytes = {}, {}, 0.0
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            phase = sample.labels.get("phase")
            if sample.name == "trtpd_gateway_ttft_breakdown_seconds_sum":
                sums[phase] = sample.value
            elif sample.name == "trtpd_gateway_ttft_breakdown_seconds_count":
                counts[phase] = sample.value
            elif sample.name == "trtpd_gateway_kv_transfer_bytes_total":
                kv_bytes = sample.value
    return sums, counts, kv_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100, help="requests per path and fleet (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=4, help="tokens per request (default: %(default)s)")
    parser.add_argument("--engines", type=Path, default=Path("engines"), help="reference engines folder")
    args = parser.parse_args()
    os.environ.setdefault("TRTPD_HOME", tempfile.mkdtemp(prefix="trtpd-bench-"))

    import httpx

    from trtpd.engine.reference_engines import build_reference
    from trtpd.engine.text_tokenizers import load_text_tokenizer
    from trtpd.fleet.gateway_process import attach_gateway
    from trtpd.fleet.launcher import fleet_down, fleet_up
    from trtpd.fleet.serve_workers import ServeStarter
    from trtpd.kv.handle import load_or_create_key_file
    from trtpd.orchestration.transport import SamplingInputs
    from trtpd.repo.reference import ReferenceDeployment
    from trtpd.transports.triton_grpc import RoleClient
    from trtpd.transports.trtllm_http import ServeClient

    root = build_reference("tiny-llama", args.engines)[0].parent
    spec = ReferenceDeployment(root, kv_transport="tcp")
    fleets = {}
    try:
        fleets["triton"] = fleet_up("bench-triton", spec, prefill=1, decode=1, replace=True)
        attach_gateway(fleets["triton"], no_auth=True)
        fleets["trtllm-serve"] = fleet_up("bench-serve", spec, prefill=1, decode=1, replace=True,
                                          starter=ServeStarter(spec))
        attach_gateway(fleets["trtllm-serve"], no_auth=True)
        prompt = "The quick brown fox jumps over the lazy dog. " * 4
        ids = load_text_tokenizer(fleets["triton"].tokenizer_dir).encode(prompt)
        sampling = SamplingInputs(max_new_tokens=args.max_tokens, end_id=-1)
        print(f"prompt {len(ids)} tokens, {args.max_tokens} new tokens, greedy; {args.requests} requests per "
              f"path, in turns; cores {sorted(os.sched_getaffinity(0))}")

        def clients(name: str):
            fleet = fleets[name]
            key = load_or_create_key_file(fleet.key_file)
            by_role = {i.role: i for i in fleet.instances}
            if name == "triton":
                # as the gateway's own clients: layerwise KV transfer (the role models overlap it with prefill)
                return [RoleClient(r, by_role[r].grpc_url, by_role[r].model, key) for r in ("prefill", "decode")]
            return [ServeClient(r, by_role[r].http_url, by_role[r].model, key) for r in ("prefill", "decode")]

        async def direct(prefill, decode, i: int) -> float:
            t0 = time.perf_counter()
            handle = None
            async for chunk in prefill.stream(f"d{i}-p", "context_only", ids, sampling):
                handle = chunk.handle or handle
            async for _ in decode.stream(f"d{i}-d", "generation_only", ids, sampling, handle=handle):
                pass
            return time.perf_counter() - t0

        async def run() -> dict[str, dict[str, list[float]]]:
            pairs = {name: clients(name) for name in fleets}
            gateways = {name: httpx.AsyncClient(base_url=f"http://127.0.0.1:{f.gateway['port']}", timeout=60)
                        for name, f in fleets.items()}
            body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0,
                    "ignore_eos": True}
            out = {name: {"transport": [], "gateway": []} for name in fleets}

            async def via_gateway(name: str) -> float:
                t0 = time.perf_counter()
                r = await gateways[name].post("/v1/completions", json=body)
                r.raise_for_status()
                return time.perf_counter() - t0
            for i in range(5):        # warm both paths of both fleets
                for name in fleets:
                    await direct(*pairs[name], i)
                    await via_gateway(name)
            for i in range(args.requests):
                for name in fleets:
                    out[name]["transport"].append(await direct(*pairs[name], 100 + i))
                    out[name]["gateway"].append(await via_gateway(name))
            for pair in pairs.values():
                for c in pair:
                    await c.close()
            for g in gateways.values():
                await g.aclose()
            return out

        results = asyncio.run(run())
        print(f"\n{'transport':<14}{'path':<22}{'P50 ms':>9}{'P90 ms':>9}{'mean ms':>9}")
        for name, paths in results.items():
            for path, values in paths.items():
                values = sorted(values)
                print(f"{name:<14}{path + (' (two hops)' if path == 'transport' else ' (HTTP)'):<22}"
                      f"{statistics.median(values) * 1e3:>9.2f}{values[int(0.9 * (len(values) - 1))] * 1e3:>9.2f}"
                      f"{statistics.fmean(values) * 1e3:>9.2f}")
        for name, paths in results.items():
            added = statistics.median(paths["gateway"]) - statistics.median(paths["transport"])
            print(f"gateway overhead over {name}: {added * 1e3:.2f} ms per request (median difference)")
        diff = statistics.median(results["trtllm-serve"]["transport"]) - statistics.median(results["triton"]["transport"])
        print(f"trtllm-serve transport - Triton transport (two hops, median): {diff * 1e3:+.2f} ms")
        time.sleep(1.0)     # the trtllm-serve gateway records a request once it has read the workers' records
        print(f"\nTTFT breakdown through each gateway (mean per request, ms; the Triton role models report it on "
              f"their responses, trtllm-serve workers at /perf_metrics)")
        print(f"{'transport':<14}" + "".join(f"{p:>17}" for p in PHASES) + f"{'KV bytes':>10}{'requests':>10}")
        for name, fleet in fleets.items():
            text = httpx.get(f"http://127.0.0.1:{fleet.gateway['port']}/metrics", timeout=10).text
            sums, counts, kv_bytes = breakdown(text)
            n = counts.get("kv_transfer", 0)
            print(f"{name:<14}" + "".join(f"{sums.get(p, 0) / max(1, counts.get(p, 0)) * 1e3:>17.3f}" for p in PHASES)
                  + f"{kv_bytes / max(1, n):>10.0f}{n:>10.0f}")

        # a worker that joins the trtllm-serve fleet by registering with its gateway
        serve = fleets["trtllm-serve"]
        gateway = f"http://127.0.0.1:{serve.gateway['port']}"
        from trtpd.kv.auth import cluster_token, gateway_admin_token
        key = load_or_create_key_file(serve.key_file)
        folder = Path(tempfile.mkdtemp(prefix="trtpd-join-"))
        state = folder / "state.json"
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "trtpd.serve_twin", str(root), "--host", "127.0.0.1",
                                 "--port", "0", "--server_role", "GENERATION", "--twin_key_file", serve.key_file,
                                 "--twin_state_file", str(state), "--disagg_cluster_uri", f"{gateway}/cluster"],
                                stdout=open(folder / "worker.log", "wb"), stderr=subprocess.STDOUT)
        try:
            member = None
            with httpx.Client(base_url=gateway, timeout=10) as http:
                while member is None:
                    info = http.get("/cluster_info", headers={"Authorization": f"Bearer {cluster_token(key)}"}).json()
                    names = [w["name"] for w in info["current_workers"]["generation_servers"]]
                    member = names[0] if names else None
                    time.sleep(0.005)
                registered = time.monotonic()
                while {i["name"]: i["state"] for i in http.get("/health").json()["instances"]}.get(member) != "ready":
                    time.sleep(0.005)
                routable = time.monotonic()
                since = time.time()
                first = None
                while first is None:
                    http.post("/v1/completions", json={"model": "tiny-llama", "prompt": prompt, "max_tokens": 2,
                                                        "temperature": 0}).raise_for_status()
                    samples = http.get("/admin/requests", params={"since": since},
                                       headers={"Authorization": f"Bearer {gateway_admin_token(key)}"}).json()
                    if any(s["decode_instance"] == member for s in samples["requests"]):
                        first = time.monotonic()
            print(f"\njoin: process start -> registered {registered - started:.2f} s (engine load), registered -> "
                  f"routable {1e3 * (routable - registered):.0f} ms (the gateway's next probe), registered -> first "
                  f"request served there {1e3 * (first - registered):.0f} ms")
        finally:
            proc.terminate()
            proc.wait(15)
    finally:
        for fleet in fleets.values():
            fleet_down(fleet.name)


if __name__ == "__main__":
    main()

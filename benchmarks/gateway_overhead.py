"""What the OpenAI gateway adds over calling a Triton instance directly, measured side by side in one run.

A colocated fleet of one instance (its own tritonserver) behind the gateway. The same 1-token requests
(a short prompt, max_tokens 1, greedy) go, in turn, (a) straight to the instance over Triton's gRPC
stream with tritonclient (with the orchestrator token the instance requires), (b) through the gateway's
/v1/completions with the official `openai` client and (c) the same with plain httpx. The difference of the medians is the gateway's overhead:
HTTP + JSON, tokenization, routing, its own gRPC hop.

    .venv/bin/python benchmarks/gateway_overhead.py [--requests 200] [--engines engines]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200, help="requests per path (default: %(default)s)")
    parser.add_argument("--engines", type=Path, default=Path("engines"), help="reference engines folder")
    args = parser.parse_args()
    os.environ.setdefault("TRTPD_HOME", tempfile.mkdtemp(prefix="trtpd-bench-"))

    import openai

    from trtpd.engine.reference_engines import build_reference
    from trtpd.fleet.launcher import fleet_down, fleet_up
    from trtpd.fleet.gateway_process import api_key, attach_gateway
    from trtpd.transports.triton_grpc import RoleClient
    from trtpd.orchestration.transport import SamplingInputs
    from trtpd.kv.handle import load_or_create_key_file
    from trtpd.repo.reference import ReferenceDeployment
    from trtpd.engine.text_tokenizers import load_text_tokenizer

    root = build_reference("tiny-llama", args.engines)[0].parent
    fleet = fleet_up("bench-gw", ReferenceDeployment(root, mode="colocated"), colocated=1, replace=True)
    try:
        attach_gateway(fleet)
        inst = fleet.instances[0]
        prompt = "The quick brown fox"
        ids = load_text_tokenizer(fleet.tokenizer_dir).encode(prompt)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{fleet.gateway['port']}/v1", api_key=api_key(fleet),
                               max_retries=0)

        async def direct_once(role: RoleClient, i: int) -> float:
            t0 = time.perf_counter()
            async for _ in role.stream(f"direct-{i}", "", ids, SamplingInputs(max_new_tokens=1)):
                pass
            return time.perf_counter() - t0

        def gateway_once() -> float:
            t0 = time.perf_counter()
            client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=1, temperature=0)
            return time.perf_counter() - t0

        import httpx
        raw = httpx.Client(base_url=f"http://127.0.0.1:{fleet.gateway['port']}",
                           headers={"Authorization": f"Bearer {api_key(fleet)}"})

        def raw_once() -> float:   # the same request without the openai client's own work
            t0 = time.perf_counter()
            raw.post("/v1/completions", json={"model": "tiny-llama", "prompt": prompt, "max_tokens": 1,
                                              "temperature": 0}).raise_for_status()
            return time.perf_counter() - t0

        async def run() -> tuple[list[float], list[float]]:
            role = RoleClient(inst.name, inst.grpc_url, inst.model, load_or_create_key_file(fleet.key_file))
            direct, via, via_raw = [], [], []
            for i in range(10):   # warm-up, every path
                await direct_once(role, -i - 1)
                await asyncio.to_thread(gateway_once)
                await asyncio.to_thread(raw_once)
            for i in range(args.requests):
                direct.append(await direct_once(role, i))
                via.append(await asyncio.to_thread(gateway_once))
                via_raw.append(await asyncio.to_thread(raw_once))
            await role.close()
            return direct, via, via_raw

        direct, via, via_raw = asyncio.run(run())
    finally:
        fleet_down("bench-gw")
    q = lambda xs, p: statistics.quantiles(xs, n=100)[p - 1] * 1000   # noqa: E731
    print(f"{args.requests} requests per path, alternating; 1 output token, {len(ids)}-token prompt")
    print("| path | P50 ms | P90 ms | P99 ms |\n|---|---|---|---|")
    print(f"| direct Triton gRPC (tritonclient) | {q(direct, 50):.2f} | {q(direct, 90):.2f} | {q(direct, 99):.2f} |")
    print(f"| gateway /v1/completions (openai) | {q(via, 50):.2f} | {q(via, 90):.2f} | {q(via, 99):.2f} |")
    print(f"| gateway /v1/completions (httpx, keep-alive) | {q(via_raw, 50):.2f} | {q(via_raw, 90):.2f} | "
          f"{q(via_raw, 99):.2f} |")
    print(f"gateway overhead at P50: {q(via, 50) - q(direct, 50):.2f} ms with the openai client, "
          f"{q(via_raw, 50) - q(direct, 50):.2f} ms with plain httpx (goal <= 1 ms)")


if __name__ == "__main__":
    main()

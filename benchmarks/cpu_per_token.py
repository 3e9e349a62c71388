"""CPU time per generated token: a disaggregated fleet (1 prefill + 1 decode instance) against a colocated
fleet (2 instances), both behind the gateway, the same requests, measured one after the other in one run.

CPU time is read from /proc (user + system) for every process of the deployment: each instance's
tritonserver and its python-backend stubs (its process group) and the gateway, before and after the
workload; tokens are the completion tokens the gateway reports.

    .venv/bin/python benchmarks/cpu_per_token.py [--requests 40] [--rate 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import replace
from pathlib import Path

from trtpd.bench.proc_cpu import cpu_s, group_pids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rate", type=float, default=3.0, help="requests per second (Poisson)")
    parser.add_argument("--workload", default="cpu-demo")
    parser.add_argument("--engines", type=Path, default=Path("engines"))
    args = parser.parse_args()
    os.environ.setdefault("TRTPD_HOME", tempfile.mkdtemp(prefix="trtpd-bench-"))

    from trtpd.bench.openai_load import run_openai
    from trtpd.bench.run import make_requests
    from trtpd.deploy.spec import ReferenceDeployment
    from trtpd.engine.reference_engines import build_reference
    from trtpd.engine.checkpoint import load_checkpoint
    from trtpd.fleet.gateway_process import api_key, attach_gateway
    from trtpd.fleet.launcher import fleet_down, fleet_up

    root = build_reference("tiny-llama", args.engines)[0].parent
    tokenizer = load_checkpoint(root / "checkpoint").load_tokenizer()
    requests = make_requests(tokenizer, args.workload, args.rate, args.requests, 0, 2048)
    rows = []
    for mode, counts in (("disaggregated", {"prefill": 1, "decode": 1}), ("colocated", {"colocated": 2})):
        fleet = fleet_up(f"cpu-{mode}", ReferenceDeployment(root, mode=mode), replace=True, **counts)
        try:
            attach_gateway(fleet)
            url = f"http://127.0.0.1:{fleet.gateway['port']}/v1"
            run_openai(url, "tiny-llama", [replace(requests[0], request_id="warmup", send_at_s=0.0)],
                       api_key=api_key(fleet))
            pgids = {i.server.pid for i in fleet.instances}
            gateway = {int(fleet.gateway["pid"])}
            before = cpu_s(group_pids(pgids)), cpu_s(gateway)
            results = run_openai(url, "tiny-llama", requests, api_key=api_key(fleet))
            after = cpu_s(group_pids(pgids)), cpu_s(gateway)
        finally:
            fleet_down(fleet.name)
        tokens = sum(r.num_tokens for r in results if r.error is None)
        instances_s, gateway_s = after[0] - before[0], after[1] - before[1]
        rows.append((mode, tokens, instances_s, gateway_s, sum(r.error is not None for r in results)))
    print(f"{args.requests} requests, Poisson {args.rate}/s, workload {args.workload}; CPU = user + system")
    print("| fleet | tokens | instances CPU s | gateway CPU s | CPU ms per token | errors |\n|---|---|---|---|---|---|")
    for mode, tokens, inst_s, gw_s, errors in rows:
        print(f"| {mode} | {tokens} | {inst_s:.2f} | {gw_s:.2f} | {(inst_s + gw_s) / max(tokens, 1) * 1000:.2f} "
              f"| {errors} |")


if __name__ == "__main__":
    main()

"""How Triton hands requests to a model's instance group, which the simulator mirrors when it is held against a
colocated deployment (trtpd.sim.fidelity.mirrored_clusters; benchmarks/validate_sim.py).

The colocated reference deployment is one tritonserver whose `colocated` model has two instances (each a stub
process with an engine). The role model's execute() queues a request for its engine and returns, so both
instances are always free, and Triton (rate limiting off: "schedules ... as soon as a model instance is
available", docs/user_guide/rate_limiter.md) gives them requests in turn, not by their load: the simulator's
mirror of this deployment routes round robin. Which instance ran a request is read from the stubs' CPU: a prompt
of 600 tokens is ~100 ms of one engine's compute, an idle stub spends a few ms.
"""

from __future__ import annotations

import pytest

from trtpd.bench.client import BenchRequest, run_stream
from trtpd.bench.proc_cpu import cpu_s
from trtpd.bench.prompts import prompt_with_tokens
from trtpd.fleet import deployment
from trtpd.serving import stub_watch

pytestmark = pytest.mark.e2e


def test_triton_hands_an_instance_groups_requests_to_its_instances_in_turn(fp16_coloc, tokenizer):
    stubs = sorted(e.pid for e in stub_watch.read_registry(deployment.deployment_dir(fp16_coloc.name))
                   if e.model == "colocated")
    assert len(stubs) == 2
    prompt = prompt_with_tokens(tokenizer, 600, seed=3)
    ran_on = []
    for i in range(6):      # one after another: both instances are idle each time
        before = [cpu_s([pid]) for pid in stubs]
        (result,) = run_stream(fp16_coloc.grpc_url, [BenchRequest(f"dispatch-{i}", prompt, 1, 0.0)])
        assert result.error is None, result.error
        spent = [cpu_s([pid]) - b for pid, b in zip(stubs, before)]
        assert max(spent) > 3 * min(spent) + 0.02, spent     # one instance computed the prompt
        ran_on.append(spent.index(max(spent)))
    assert ran_on[::2] == [ran_on[0]] * 3 and ran_on[1::2] == [1 - ran_on[0]] * 3, ran_on

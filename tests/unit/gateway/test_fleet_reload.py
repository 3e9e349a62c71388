"""The gateway following fleet.json under the controller: instances added and removed, drains, the canary
split's cohorts, the routing policy; and the orchestrator waiting for a replacement instance."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from trtpd.gateway.config import from_fleet_file
from trtpd.orchestration.orchestrator import Orchestrator
from trtpd.orchestration.transport import RoleChunk, SamplingInputs
from trtpd.gateway.service import FleetService
from trtpd.routing.core import InstanceView, Router


def instance(name: str, role: str, revision: int = 1, admin_state: str = "ready") -> dict:
    return {"name": name, "role": role, "model": role, "grpc_url": "127.0.0.1:1", "metrics_url": "http://127.0.0.1:1",
            "max_input_len": 64, "max_seq_len": 96, "revision": revision, "admin_state": admin_state}


def write(path: Path, folder: Path, instances: list[dict], traffic=None, routing=None) -> None:
    body = {"name": "t", "mode": "disaggregated", "key_file": str(path.parent / "kv.key"),
            "tokenizer_dir": str(folder), "instances": instances, "traffic": traffic, "routing": routing}
    path.write_text(json.dumps(body))
    st = path.stat()   # a rewrite within one mtime tick must still be seen: move the mtime on
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


@pytest.fixture
def fleet_file(tmp_path, fp16_root) -> Path:
    path = tmp_path / "fleet.json"
    write(path, fp16_root / "checkpoint", [instance("prefill-0", "prefill"), instance("decode-0", "decode")])
    return path


def in_loop(test):
    """Runs the test inside an event loop: the gRPC asyncio clients the service makes need one."""
    import functools

    @functools.wraps(test)
    def run(*args, **kwargs):
        async def body():
            return test(*args, **kwargs)
        return asyncio.run(body())
    return run


def in_async(test):
    """Runs an async test in its own event loop."""
    import functools

    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))
    return run


def ready(svc: FleetService, *names_roles) -> None:
    """What a probe would report: these instances up and idle."""
    svc.router.update([InstanceView(n, r, max_kv_blocks=100, free_kv_blocks=100) for n, r in names_roles], 1.0)
    svc._apply_draining()


@in_loop
def test_reload_adds_and_removes_instances_and_applies_drains(fleet_file, fp16_root):
    svc = FleetService(from_fleet_file(fleet_file))
    assert svc.reload() and set(svc.clients) == {"prefill-0", "decode-0"}
    assert not svc.reload()   # unchanged file: nothing read
    write(fleet_file, fp16_root / "checkpoint", [instance("prefill-0", "prefill"),
                                                 instance("decode-0", "decode", admin_state="draining"),
                                                 instance("decode-1", "decode")])
    assert svc.reload()
    assert set(svc.clients) == {"prefill-0", "decode-0", "decode-1"} and svc.draining == {"decode-0"}
    ready(svc, ("prefill-0", "prefill"), ("decode-0", "decode"), ("decode-1", "decode"))
    states = {v.name: v.state for v in svc.router.instances()}
    assert states == {"prefill-0": "ready", "decode-0": "draining", "decode-1": "ready"}
    route = svc.router.pick_decode("r1", 10, 10, 2.0)
    assert route.instance == "decode-1"
    write(fleet_file, fp16_root / "checkpoint", [instance("prefill-0", "prefill"), instance("decode-1", "decode")])
    assert svc.reload()
    assert set(svc.clients) == {"prefill-0", "decode-1"} and [c.name for c, _ in svc._closing] == ["decode-0"]
    assert svc.draining == set()


@in_loop
def test_an_instance_gone_from_the_file_gets_no_request_before_the_next_probe(fleet_file, fp16_root):
    """The controller removes a drained instance from fleet.json; until the next probe drops it from the
    router's snapshot it must stay unroutable (its client is gone: a pick of it was a KeyError, a 500)."""
    svc = FleetService(from_fleet_file(fleet_file))
    write(fleet_file, fp16_root / "checkpoint", [instance("prefill-0", "prefill"), instance("prefill-1", "prefill"),
                                                 instance("decode-0", "decode")])
    assert svc.reload()
    ready(svc, ("prefill-0", "prefill"), ("prefill-1", "prefill"), ("decode-0", "decode"))
    for gone in ("prefill-1", "prefill-0"):        # drained first, or removed at once
        if gone == "prefill-1":
            write(fleet_file, fp16_root / "checkpoint", [instance("prefill-0", "prefill"),
                                                         instance("prefill-1", "prefill", admin_state="draining"),
                                                         instance("decode-0", "decode")])
            assert svc.reload()
            keep = [instance("prefill-0", "prefill"), instance("decode-0", "decode")]
        else:
            write(fleet_file, fp16_root / "checkpoint", [instance("prefill-1", "prefill"), instance("decode-0", "decode")])
            keep = [instance("decode-0", "decode")]
        write(fleet_file, fp16_root / "checkpoint", keep)
        assert svc.reload() and gone not in svc.clients
        picks = {svc.router.pick_prefill(f"{gone}-{k}", 10, 2.0 + k) for k in range(4)}
        assert all(p is None or p.instance in svc.clients for p in picks), picks


@in_loop
def test_undraining_in_the_file_restores_the_instance(fleet_file, fp16_root):
    svc = FleetService(from_fleet_file(fleet_file))
    write(fleet_file, fp16_root / "checkpoint", [instance("prefill-0", "prefill"),
                                                 instance("decode-0", "decode", admin_state="draining")])
    svc.reload()
    ready(svc, ("prefill-0", "prefill"), ("decode-0", "decode"))
    assert svc.router.pick_decode("r1", 10, 10, 2.0) is None
    write(fleet_file, fp16_root / "checkpoint", [instance("prefill-0", "prefill"), instance("decode-0", "decode")])
    svc.reload()
    assert svc.router.pick_decode("r2", 10, 10, 2.0).instance == "decode-0"


@in_loop
def test_canary_cohorts_and_their_fallback(fleet_file, fp16_root):
    svc = FleetService(from_fleet_file(fleet_file))
    traffic = {"stable_revision": 1, "canary_revision": 2, "canary_share": 0.5, "changed_roles": ["decode"],
               "canary_instances": ["decode-1"]}
    write(fleet_file, fp16_root / "checkpoint", [instance("prefill-0", "prefill"), instance("decode-0", "decode"),
                                                 instance("decode-1", "decode", revision=2)], traffic=traffic)
    svc.reload()
    ready(svc, ("prefill-0", "prefill"), ("decode-0", "decode"), ("decode-1", "decode"))
    cohorts = [svc.cohort() for _ in range(4)]
    assert [c.revision for c in cohorts] == [1, 2, 1, 2]
    assert [c.exclude for c in cohorts] == [{"decode-1"}, {"decode-0"}, {"decode-1"}, {"decode-0"}]
    # the canary instance is not ready (died): canary requests go to the stable cohort instead of failing
    ready(svc, ("prefill-0", "prefill"), ("decode-0", "decode"))
    assert [(c.revision, c.exclude) for c in (svc.cohort(), svc.cohort())] == [(1, {"decode-1"})] * 2
    # the last stable decode drains (promotion): stable requests go to the canary cohort
    ready(svc, ("prefill-0", "prefill"), ("decode-0", "decode"), ("decode-1", "decode"))
    svc.router.set_state("decode-0", "draining")
    assert [(c.revision, c.exclude) for c in (svc.cohort(), svc.cohort())] == [(2, {"decode-0"})] * 2


@in_loop
def test_routing_policy_from_the_file(fleet_file, fp16_root):
    svc = FleetService(from_fleet_file(fleet_file))
    write(fleet_file, fp16_root / "checkpoint", [instance("prefill-0", "prefill"), instance("decode-0", "decode")],
          routing={"balance": "round_robin", "max_prefill_attempts": 3, "prefill_buckets": [[512, ["prefill-0"]]]})
    svc.reload()
    assert svc.router.policy.balance == "round_robin" and svc.router.policy.max_prefill_attempts == 3
    assert svc.router.policy.prefill_buckets == ((512, ("prefill-0",)),)


class _FakeClient:
    def __init__(self, name: str) -> None:
        self.name = name

    async def stream(self, request_id, request_type, ids, sampling, handle=None):
        yield RoleChunk([7], handle=b"h" if request_type == "context_only" else None, final=True)


def test_a_request_waits_for_a_replacement_instance():
    router = Router()
    router.update([InstanceView("prefill-0", "prefill")], 0.0)   # no decode instance at all yet
    clients = {"prefill-0": _FakeClient("prefill-0"), "decode-1": _FakeClient("decode-1")}
    orch = Orchestrator("disaggregated", router, clients, wait_for_instance_s=5.0)

    async def go():
        async def replacement():
            await asyncio.sleep(0.3)
            router.update([InstanceView("prefill-0", "prefill"), InstanceView("decode-1", "decode")], 1.0)
        task = asyncio.create_task(replacement())
        out = [g async for g in orch.generate("r", [1, 2, 3], SamplingInputs(max_new_tokens=1))]
        await task
        return out
    out = asyncio.run(go())
    assert out[0].token_ids == [7] and out[0].decode_instance == "decode-1"
    assert orch.holds == {}   # what the request held is dropped when it ends


def test_without_waiting_no_instance_is_an_immediate_503():
    from trtpd.orchestration.orchestrator import OrchestratorError
    router = Router()
    router.update([InstanceView("prefill-0", "prefill")], 0.0)
    orch = Orchestrator("disaggregated", router, {"prefill-0": _FakeClient("prefill-0")})

    async def go():
        return [g async for g in orch.generate("r", [1, 2, 3], SamplingInputs(max_new_tokens=1))]
    with pytest.raises(OrchestratorError, match="no decode instance"):
        asyncio.run(go())


class _Instance:
    """A role instance that answers at once; `during` runs while it serves its first request (the split moving
    under a request in flight). Records what it was sent."""

    reports_perf_later = False

    def __init__(self, name: str, during=None) -> None:
        self.name, self.during, self.calls = name, during, []

    async def stream(self, request_id, request_type, ids, sampling, handle=None):
        self.calls.append((request_type, handle))
        if self.during is not None:
            during, self.during = self.during, None
            during()
        yield RoleChunk([7], handle=self.name.encode() if request_type == "context_only" else None, final=True)


async def _serve(svc: FleetService, instances: dict[str, _Instance], cohort):
    orch = Orchestrator("disaggregated", svc.router, instances, wait_for_instance_s=1.0)
    out = [g async for g in orch.generate("r", [1, 2, 3], SamplingInputs(max_new_tokens=1), cohort)]
    assert orch.holds == {} and svc.router.num_tracked_requests == 0   # nothing held once it ended
    return out


@in_async
async def test_a_request_prefilled_before_promotion_decodes_on_the_new_revision(fleet_file, fp16_root):
    """The last stable decode drains (promotion) while a stable request is prefilled: it is decoded by the
    canary's decode instance, which reads the unchanged prefill's KV, instead of waiting for a stable one."""
    traffic = {"stable_revision": 1, "canary_revision": 2, "canary_share": 0.5, "changed_roles": ["decode"],
               "canary_instances": ["decode-1"]}
    write(fleet_file, fp16_root / "checkpoint", [instance("prefill-0", "prefill"), instance("decode-0", "decode"),
                                                 instance("decode-1", "decode", revision=2)], traffic=traffic)
    svc = FleetService(from_fleet_file(fleet_file))
    svc.reload()
    ready(svc, ("prefill-0", "prefill"), ("decode-0", "decode"), ("decode-1", "decode"))
    cohort = svc.cohort()
    assert (cohort.revision, cohort.exclude) == (1, {"decode-1"})
    instances = {"prefill-0": _Instance("prefill-0", lambda: svc.router.set_state("decode-0", "draining")),
                 "decode-0": _Instance("decode-0"), "decode-1": _Instance("decode-1")}
    out = await _serve(svc, instances, cohort)
    assert [(g.prefill_instance, g.decode_instance) for g in out] == [("prefill-0", "decode-1")]
    assert instances["decode-1"].calls == [("generation_only", b"prefill-0")] and not instances["decode-0"].calls
    assert cohort.revision == 2   # counted as the revision that served it


@in_async
async def test_a_request_whose_kv_the_new_cohort_cannot_read_is_prefilled_again(fleet_file, fp16_root):
    """A rollout changing both roles (say the KV dtype) rolls back while a canary request is prefilled on the
    canary's prefill: no stable decode may read that KV, so the request is prefilled again on the stable
    prefill and decoded by the stable decode; the canary decode is never sent it."""
    traffic = {"stable_revision": 1, "canary_revision": 2, "canary_share": 1.0, "changed_roles": ["prefill", "decode"],
               "canary_instances": ["prefill-1", "decode-1"]}
    write(fleet_file, fp16_root / "checkpoint",
          [instance("prefill-0", "prefill"), instance("decode-0", "decode"),
           instance("prefill-1", "prefill", revision=2), instance("decode-1", "decode", revision=2)], traffic=traffic)
    svc = FleetService(from_fleet_file(fleet_file))
    svc.reload()
    ready(svc, ("prefill-0", "prefill"), ("decode-0", "decode"), ("prefill-1", "prefill"), ("decode-1", "decode"))
    cohort = svc.cohort()
    assert (cohort.revision, cohort.exclude) == (2, {"prefill-0", "decode-0"})

    def roll_back():
        for name in ("prefill-1", "decode-1"):
            svc.router.set_state(name, "draining")
    instances = {"prefill-0": _Instance("prefill-0"), "decode-0": _Instance("decode-0"),
                 "prefill-1": _Instance("prefill-1", roll_back), "decode-1": _Instance("decode-1")}
    out = await _serve(svc, instances, cohort)
    assert [(g.prefill_instance, g.decode_instance) for g in out] == [("prefill-0", "decode-0")]
    assert [c[0] for c in instances["prefill-1"].calls] == ["context_only"]
    assert instances["decode-0"].calls == [("generation_only", b"prefill-0")] and not instances["decode-1"].calls
    assert cohort.revision == 1

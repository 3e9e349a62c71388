"""A fleet through the real server: each instance its own tritonserver. A request driven by hand through a
prefill instance and a decode instance gives the single server's greedy tokens; a 2P+2D fleet starts decode
first and `trtpd status/down` see and stop all of it; a SIGKILLed stub takes its own instance down, only it.
Every fleet is stopped in a finally block."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from trtpd.bench.prompts import prompt_with_tokens
from trtpd.fleet.launcher import fleet_down, fleet_status, fleet_up
from trtpd.kv.auth import AUTH_PARAMETER, orchestrator_token
from trtpd.kv.handle import load_or_create_key_file
from trtpd.deploy.spec import ReferenceDeployment
from trtpd.serving import stub_watch

from .conftest import Server

pytestmark = pytest.mark.e2e
MAX_TOKENS = 12
DOWN_BOUND_S = 20.0
DEATH_BOUND_S = 20.0      # SIGKILL of the stub -> its tritonserver has exited
TRTPD = Path(sys.executable).parent / "trtpd"


def wait_for(cond, timeout_s: float, what: str) -> float:
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.05)
    return time.monotonic() - start


def tokens_of(responses) -> list[int]:
    return [int(t) for r in responses if r.as_numpy("output_ids") is not None for t in r.as_numpy("output_ids").reshape(-1)]


def by_hand(fleet, ids: list[int]) -> list[int]:
    """What disagg_bls does (bls_model._disaggregated), across two instance servers: context_only with
    layer-wise transfer to prefill, then generation_only with its handle to decode."""
    key = load_or_create_key_file(Path(fleet.key_file))
    prefill, decode = fleet.instance("prefill-0"), fleet.instance("decode-0")
    input_ids = np.array([ids], dtype=np.int32)
    tensors = {"input_ids": input_ids, "input_lengths": np.array([[len(ids)]], dtype=np.int32),
               "request_output_len": np.array([[MAX_TOKENS]], dtype=np.int32),
               "streaming": np.array([[True]], dtype=np.bool_)}

    def auth(request_type: str) -> dict:
        return {"request_type": request_type, AUTH_PARAMETER: orchestrator_token(key, request_type, input_ids, time.time())}

    first = Server(prefill.server, prefill.name).call(
        prefill.model, tensors, {**auth("context_only"), "layerwise_kv_transfer": True}, auth=False)
    handles = [r.as_numpy("context_phase_params") for r in first if r.as_numpy("context_phase_params") is not None]
    # layer-wise: prefill answers with the handle when it schedules the request; decode makes every token
    assert len(handles) == 1 and tokens_of(first) == [], (len(handles), tokens_of(first))
    rest = Server(decode.server, decode.name).call(
        decode.model, {**tensors, "context_phase_params": handles[-1].reshape(1, -1).astype(np.uint8)},
        auth("generation_only"), auth=False)
    return tokens_of(rest)


def instance_labels(server: Server, model: str) -> set[tuple[str, str]]:
    return {(dict(labels)["instance"], dict(labels)["role"]) for (name, labels), _ in server.metrics().items()
            if name == "nv_trt_llm_kv_cache_block_metrics" and dict(labels).get("model") == model}


def processes(fleet) -> dict[int, int]:
    """pid -> start time of every tritonserver and python stub of the fleet."""
    out = {i.server.pid: i.server.start_time for i in fleet.instances}
    for i in fleet.instances:
        out.update({pid: stub_watch.start_time(pid) for pid in stub_watch.leftover_stubs(i.server.repo, i.server.start_time)})
    return out


def test_a_request_by_hand_through_a_1p1d_fleet_matches_the_single_server(trtpd_home, fp16_root, fp16_disagg, tokenizer):
    ids = tokenizer.encode(prompt_with_tokens(tokenizer, 45, seed=45))
    expected = tokens_of(fp16_disagg.call("disagg_bls", {
        "input_ids": np.array([ids], dtype=np.int32), "input_lengths": np.array([[len(ids)]], dtype=np.int32),
        "request_output_len": np.array([[MAX_TOKENS]], dtype=np.int32),
        "streaming": np.array([[True]], dtype=np.bool_)}))
    assert len(expected) == MAX_TOKENS
    fleet = fleet_up("e2e-fleet-1p1d", ReferenceDeployment(fp16_root), prefill=1, decode=1)
    try:
        prefill = Server(fleet.instance("prefill-0").server, "prefill-0")
        decode = Server(fleet.instance("decode-0").server, "decode-0")
        ports = [p for i in fleet.instances for p in (i.server.ports.http, i.server.ports.grpc, i.server.ports.metrics)]
        assert len(set(ports)) == 6 and prefill.server.is_ready() and decode.server.is_ready()
        free = {"prefill": prefill.kv_blocks("prefill"), "decode": decode.kv_blocks("decode")}
        assert by_hand(fleet, ids) == expected
        prefill.wait_blocks("prefill", free["prefill"])
        decode.wait_blocks("decode", free["decode"])
        assert instance_labels(prefill, "prefill") == {("prefill-0", "prefill")}
        assert instance_labels(decode, "decode") == {("decode-0", "decode")}
        # the single server keeps one series per model: instance = model name
        assert instance_labels(fp16_disagg, "prefill") == {("prefill", "prefill")}
    finally:
        fleet_down(fleet.name)


def test_2p2d_fleet_starts_decode_first_and_status_and_down_see_all_of_it(trtpd_home, fp16_root):
    name = "e2e-fleet-2p2d"
    fleet = fleet_up(name, ReferenceDeployment(fp16_root), prefill=2, decode=2)
    stopped = False
    try:
        starts = {i.name: i.server.start_time for i in fleet.instances}
        assert max(starts["decode-0"], starts["decode-1"]) <= min(starts["prefill-0"], starts["prefill-1"]), starts
        status = subprocess.run([str(TRTPD), "status", "--name", name, "--json"], capture_output=True, text=True,
                                env=os.environ, timeout=60)
        assert status.returncode == 0, status.stderr
        [row] = json.loads(status.stdout)
        assert (row["kind"], row["state"]) == ("fleet", "ready")
        assert sorted((i["name"], i["role"], i["state"]) for i in row["instances"]) == [
            ("decode-0", "decode", "ready"), ("decode-1", "decode", "ready"),
            ("prefill-0", "prefill", "ready"), ("prefill-1", "prefill", "ready")]
        assert all(i["load"]["kv_used"] == 0 and i["load"]["kv_max"] > 0 for i in row["instances"])
        assert len({i["grpc"] for i in row["instances"]}) == 4
        procs = processes(fleet)
        assert len(procs) == 8       # 4 servers, one stub each
        start = time.monotonic()
        down = subprocess.run([str(TRTPD), "down", "--name", name], capture_output=True, text=True,
                              env=os.environ, timeout=120)
        took = time.monotonic() - start
        stopped = down.returncode == 0
        assert stopped and f"stopped fleet {name}" in down.stdout, down.stdout + down.stderr
        assert took < DOWN_BOUND_S, took
        assert [p for p, st in procs.items() if stub_watch.is_running(p, st)] == []
    finally:
        if not stopped:
            fleet_down(name)


def test_a_killed_stub_stops_only_its_own_instance(trtpd_home, fp16_root):
    fleet = fleet_up("e2e-fleet-death", ReferenceDeployment(fp16_root), prefill=1, decode=1)
    try:
        prefill, decode = fleet.instance("prefill-0"), fleet.instance("decode-0")
        [stub] = stub_watch.leftover_stubs(prefill.server.repo, prefill.server.start_time)
        os.kill(stub, signal.SIGKILL)
        wait_for(lambda: not prefill.server.is_alive(), DEATH_BOUND_S, "the prefill instance's tritonserver exits")
        view = {i["name"]: i for i in fleet_status(fleet.name)["instances"]}
        assert view["prefill-0"]["state"] == "failed", view["prefill-0"]
        assert "prefill-0" in view["prefill-0"]["reason"] and f"stub pid {stub}" in view["prefill-0"]["reason"]
        assert view["decode-0"]["state"] == "ready" and decode.server.is_ready()
    finally:
        fleet_down(fleet.name)
    assert not decode.server.is_alive()

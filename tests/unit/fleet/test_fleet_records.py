"""fleet.json: round trip, owner-only mode, the field names the gateway reads, clear errors; core assignment."""

from __future__ import annotations

import json
import stat
from types import SimpleNamespace

import pytest

from trtpd.errors import TrtpdError
from trtpd.fleet.instance import assign_cpus, shares_cores
from trtpd.fleet.records import FleetRecord, InstanceRecord, list_fleets, load_fleet
from trtpd.fleet.tritonserver import ServerPorts, ServerProcess


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTPD_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def instance(name: str, role: str, http: int) -> InstanceRecord:
    server = ServerProcess(1234, "127.0.0.1", ServerPorts(http, http + 1, http + 2), f"/r/{name}/repo",
                           f"/r/{name}/tritonserver.log", f"trtpd{http}_", "/r/admin.key", 987)
    kv = "127.0.0.1:7000" if role == "prefill" else ""
    return InstanceRecord(name, role, role, server, "/e/" + role, "shm", kv, kv, [0], 8, 1024, 1536, 2048)


def test_round_trip_is_0600_and_keeps_the_gateway_fields(home):
    fleet = FleetRecord("f1", "disaggregated", "/engines/x", "/k/kv.key", "/engines/x/checkpoint",
                        [instance("decode-0", "decode", 9000), instance("prefill-0", "prefill", 9010)])
    fleet.save()
    assert stat.S_IMODE(fleet.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(fleet.path.parent.stat().st_mode) == 0o700
    again = load_fleet("f1")
    assert again == fleet
    raw = json.loads(fleet.path.read_text())
    assert {"name", "mode", "build_root", "key_file", "tokenizer_dir", "instances", "gateway",
            "started_at"} <= set(raw)
    first = raw["instances"][0]
    assert (first["name"], first["role"], first["model"], first["server"]["pid"]) == ("decode-0", "decode", "decode", 1234)
    assert first["grpc_url"] == "127.0.0.1:9001" and first["metrics_url"] == "http://127.0.0.1:9002/metrics"
    assert again.instances[1].grpc_url == "127.0.0.1:9011" and again.instances[1].kv_advertise == "127.0.0.1:7000"
    assert (first["max_batch_size"], first["num_kv_blocks"], first["max_input_len"], first["max_seq_len"]) == \
        (8, 1024, 1536, 2048)
    assert [f.name for f in list_fleets()] == ["f1"]


def test_gateway_record_survives_a_round_trip(home):
    fleet = FleetRecord("g", "colocated", "/b", "/k", "/t", [instance("colocated-0", "colocated", 9100)])
    fleet.gateway = {"pid": 42, "start_time": 7, "host": "127.0.0.1", "port": 8000}
    fleet.save()
    assert load_fleet("g").gateway == fleet.gateway


def test_missing_fleet_is_a_clear_error(home):
    with pytest.raises(TrtpdError, match="no fleet named 'nope'.*fleet.json does not exist"):
        load_fleet("nope")
    assert list_fleets() == []


def test_corrupt_fleet_file_names_the_file(home):
    (home / "deployments" / "bad").mkdir(parents=True)
    (home / "deployments" / "bad" / "fleet.json").write_text('{"name": "bad"}')
    with pytest.raises(TrtpdError, match="fleet.json: not a fleet record"):
        load_fleet("bad")


def test_cpus_round_robin():
    assert assign_cpus(2, [0, 1]) == [[0], [1]]
    assert assign_cpus(2, [0, 1, 2, 3]) == [[0, 2], [1, 3]]
    assert assign_cpus(4, [0, 1]) == [[0], [1], [0], [1]]      # 2 cores, 4 instances: shared
    assert not shares_cores(assign_cpus(2, [0, 1, 2, 3]))
    assert shares_cores(assign_cpus(3, [5, 6]))
    with pytest.raises(TrtpdError):
        assign_cpus(1, [])


def test_one_fleet_file_model_for_its_three_codecs(home):
    """The local record, the Kubernetes executor's ConfigMap text and the gateway's reading share
    trtpd/schema/fleet_file.py: what the local fleet writes reads back as its own routed view, and the gateway's
    config and directives come from it alike."""
    from trtpd.controller.k8s.fleet_file import KEY_FILE, fleet_document, fleet_instance
    from trtpd.gateway.config import fleet_directives
    from trtpd.schema.fleet_file import FleetFile, read_fleet_file

    fleet = FleetRecord("m", "disaggregated", "/b", "/k", "/t",
                        [instance("decode-0", "decode", 9000), instance("prefill-0", "prefill", 9010)],
                        traffic={"stable_revision": 1}, routing={"balance": "round_robin"})
    fleet.instances[0].admin_state = "draining"
    fleet.gateway = {"host": "127.0.0.1", "port": 8000, "pid": 42, "new_api_key": "shown once, never saved"}
    fleet.save()
    shared = read_fleet_file(fleet.path)
    assert shared == fleet.fleet_file() and shared.gateway == {"host": "127.0.0.1", "port": 8000, "pid": 42}
    assert [i.kv_advertise for i in shared.routed] == ["", "127.0.0.1:7000"] and shared.draining == {"decode-0"}
    d = fleet_directives(fleet.path)
    assert (d.draining, d.traffic, d.routing) == ({"decode-0"}, {"stable_revision": 1}, {"balance": "round_robin"})

    spec = SimpleNamespace(max_input_len=1024, max_seq_len=2048, max_batch_size=16)   # what fleet_instance reads
    text = fleet_document("k", "disaggregated", "/engines", "/engines/checkpoint",
                          [fleet_instance("decode-0", "decode", 2, "10.0.0.5", 8000, spec, "draining")], None)
    k8s = FleetFile.from_dict(json.loads(text))
    assert k8s.key_file == KEY_FILE and k8s.draining == {"decode-0"}
    # a pod runs trtllm-serve: the gateway reaches it over its OpenAI HTTP (it used to be handed a gRPC address)
    assert (k8s.instances[0].protocol, k8s.instances[0].http_url, k8s.instances[0].max_seq_len,
            k8s.instances[0].revision) == ("trtllm-serve", "10.0.0.5:8000", 2048, 2)
    bad = home / "bad.json"
    bad.write_text('{"name": "x"}')
    with pytest.raises(ValueError, match="not a fleet file"):
        read_fleet_file(bad)


def test_a_single_server_is_recorded_in_the_same_record_as_a_fleet(home):
    """One record of what runs: `trtpd up`'s single server writes fleet.json through the fleet's codec (one
    instance of role "server"); the fleet-only readers refuse it by name, the single-server readers a fleet."""
    from trtpd.fleet import deployment, records

    server = ServerProcess(4321, "127.0.0.1", ServerPorts(8000, 8001, 8002), str(home / "deployments/one/repo"),
                           str(home / "deployments/one/tritonserver.log"), "trtpd8000_", "", 555)
    deployment.Deployment("one", "disaggregated", server, 12.5, "/engines/x", "tcp").save()
    FleetRecord("many", "disaggregated", "/engines/x", "/k/kv.key", "/engines/x/checkpoint",
                [instance("decode-0", "decode", 9000)]).save()
    path = home / "deployments" / "one" / "fleet.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and not (path.parent / "deployment.json").exists()
    record = records.load_record("one")
    assert record.single_server is not None and record.single_server.server == server
    assert record.single_server.role == "server" and record.single_server.kv_transport == "tcp"
    assert record.key_file == str(home / "deployments/one/repo.kv.key")
    assert record.fleet_file().routed == ()            # a gateway routes to none of it: its ensemble is the entry
    again = deployment.Deployment.load("one")
    assert (again.name, again.mode, again.server, again.started_at, again.build_root, again.kv_transport) == \
        ("one", "disaggregated", server, 12.5, "/engines/x", "tcp")
    assert records.is_single_server("one") and not records.is_fleet("one")
    assert records.is_fleet("many") and not records.is_single_server("many")
    assert [f.name for f in list_fleets()] == ["many"]
    assert [d.name for d in deployment.list_deployments()] == ["one"]
    with pytest.raises(TrtpdError, match="'one' is a single-server deployment, not a fleet"):
        load_fleet("one")
    with pytest.raises(TrtpdError, match="'many' is a fleet, not a single-server deployment"):
        deployment.Deployment.load("many")


def test_a_world_is_one_record_and_two_routed_endpoints(home):
    """A Triton MPI world (backend tensorrt-llm) is one process, so one record; the gateway routes to its role
    models, so fleet.json also lists them, tagged with the world, with its revision and drain state. Read back,
    the record is one instance again (the endpoints are derived), and the controller's canary split, which names
    worlds, reaches the gateway as the worlds' endpoints."""
    from trtpd.gateway.config import fleet_directives, from_fleet_file
    from trtpd.schema.fleet_file import read_fleet_file

    def world(name: str, http: int, revision: int) -> InstanceRecord:
        w = instance(name, "world", http)
        w.model, w.world_roles, w.revision = "ensemble", ["prefill", "decode"], revision
        return w

    fleet = FleetRecord("w", "disaggregated", "/e", "/k/kv.key", "/t", [world("world-0", 8000, 1),
                                                                        world("world-1", 9000, 2)])
    fleet.instances[0].admin_state = "draining"
    fleet.traffic = {"stable_revision": 1, "canary_revision": 2, "canary_share": 0.5, "changed_roles": ["world"],
                     "canary_instances": ["world-1"]}
    fleet.save()
    routed = read_fleet_file(fleet.path).routed
    assert [(r.name, r.role, r.model, r.world, r.revision, r.admin_state, r.grpc_url) for r in routed] == [
        ("world-0.prefill", "prefill", "prefill", "world-0", 1, "draining", "127.0.0.1:8001"),
        ("world-0.decode", "decode", "decode", "world-0", 1, "draining", "127.0.0.1:8001"),
        ("world-1.prefill", "prefill", "prefill", "world-1", 2, "ready", "127.0.0.1:9001"),
        ("world-1.decode", "decode", "decode", "world-1", 2, "ready", "127.0.0.1:9001")]
    split = read_fleet_file(fleet.path).routed_traffic
    assert (split["changed_roles"], split["canary_instances"]) == (["prefill", "decode"],
                                                                   ["world-1.decode", "world-1.prefill"])
    again = load_fleet("w")
    assert [(i.name, i.role, i.world_roles) for i in again.instances] == [
        ("world-0", "world", ["prefill", "decode"]), ("world-1", "world", ["prefill", "decode"])]
    assert again.traffic["changed_roles"] == ["world"]       # the controller's own words are kept
    assert fleet_directives(fleet.path).traffic == split      # what the gateway applies
    (home / "t").mkdir(parents=True, exist_ok=True)
    (home / "t" / "config.json").write_text('{"eos_token_id": 2, "trtpd": {"model": "tiny-llama"}}')
    fleet.tokenizer_dir = str(home / "t")
    fleet.save()
    config = from_fleet_file(fleet.path)
    assert [(i.name, i.world) for i in config.instances] == [(r.name, r.world) for r in routed]

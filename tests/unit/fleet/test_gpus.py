"""The GPU inventory (trtpd/fleet/gpus.py): sets of GPUs per instance, never shared, freed, refused with counts;
rebuilt from what fleet.json's records hold, so a restarted controller or fleet does not assign a GPU twice."""

from __future__ import annotations

import pytest

from trtpd.errors import ConfigError
from trtpd.fleet.gpus import GpuInventory, GpuShortage, cuda_visible_devices, gpus_from_listing, parse_gpus
from trtpd.fleet.launcher import plan_waves
from trtpd.fleet.records import InstanceRecord
from trtpd.fleet.tritonserver import ServerPorts, ServerProcess


def test_each_instance_gets_its_own_set_of_the_size_it_asks_for():
    inv = GpuInventory((3, 2, 1, 0))
    assert inv.assign("decode-0", 2) == (0, 1)
    assert inv.assign("prefill-0", 1) == (2,)
    assert inv.assign("prefill-1", 1) == (3,)
    assert inv.num_free == 0
    assert set(inv.assigned["decode-0"]).isdisjoint(inv.assigned["prefill-0"] + inv.assigned["prefill-1"])


def test_a_set_prefers_neighbouring_ids():
    inv = GpuInventory((0, 1, 2, 3, 4, 5), {"a": (1,), "b": (4,)})
    assert inv.assign("tp2", 2) == (2, 3)         # not (0, 2): the lowest contiguous pair
    assert inv.assign("tp2b", 2) == (0, 5)        # none left contiguous: the lowest free


def test_stopping_frees_the_set_for_the_next_start():
    inv = GpuInventory((0, 1))
    inv.assign("decode-0", 2)
    assert not inv.can_assign(1)
    assert inv.release("decode-0") == (0, 1)
    assert inv.assign("decode-1", 2) == (0, 1)


def test_a_short_inventory_is_refused_naming_what_is_needed_and_free():
    inv = GpuInventory((0, 1, 2), {"decode-0": (0, 1)})
    with pytest.raises(GpuShortage) as exc:
        inv.assign("prefill-0", 2)
    message = str(exc.value)
    assert "instance prefill-0 needs 2 GPU(s) but 1 of the inventory's 3 are free" in message
    assert "decode-0 [0, 1]" in message
    assert "prefill-0" not in inv.assigned


def test_the_inventory_rebuilt_from_records_does_not_assign_a_held_gpu_twice():
    """fleet.json is the record: each instance's `gpus`; a restarted controller builds the inventory from it."""
    def record(name, gpus):
        server = ServerProcess(1, "127.0.0.1", ServerPorts(1, 0, 0), "", "", "p")
        inst = InstanceRecord(name, "decode", "m", server, "", "tcp", "", "", [0], 1, 1, 1, 2, gpus=gpus)
        return InstanceRecord.from_dict(inst.to_dict())     # through fleet.json's shape
    held = [record("decode-0", [0, 1]), record("prefill-0", [2])]
    inv = GpuInventory.from_holders((0, 1, 2, 3), {i.name: i.gpus for i in held})
    assert inv.free_ids == (3,)
    assert inv.assign("prefill-1", 1) == (3,)
    with pytest.raises(GpuShortage):
        inv.assign("prefill-2", 1)


def test_a_record_without_gpus_holds_none():
    server = ServerProcess(1, "127.0.0.1", ServerPorts(1, 0, 0), "", "", "p")
    data = InstanceRecord("decode-0", "decode", "m", server, "", "tcp", "", "", [0], 1, 1, 1, 2).to_dict()
    del data["gpus"]                     # a fleet.json written before the inventory existed
    assert InstanceRecord.from_dict(data).gpus == []


def test_plan_waves_assigns_disjoint_sets_per_role_or_refuses_before_any_start():
    waves = plan_waves(2, 1, 0, [0, 1], GpuInventory((0, 1, 2, 3)), {"prefill": 1, "decode": 2})
    gpus = {p.name: p.gpus for wave in waves for p in wave}
    assert gpus == {"decode-0": (0, 1), "prefill-0": (2,), "prefill-1": (3,)}
    with pytest.raises(GpuShortage, match=r"the fleet \(decode 1x2 \+ prefill 2x2\) needs 6 GPU\(s\) but 4 of"):
        plan_waves(2, 1, 0, [0, 1], GpuInventory((0, 1, 2, 3)), {"prefill": 2, "decode": 2})
    assert all(p.gpus == () for wave in plan_waves(1, 1, 0, [0, 1]) for p in wave)   # no inventory: the twin


def test_gpu_lists_parse_and_bad_ones_are_refused():
    assert parse_gpus("0,1, 3") == (0, 1, 3)
    assert cuda_visible_devices((2, 3)) == "2,3"
    for bad in ("", "0,,1", "gpu0", "-1", "0,0"):
        with pytest.raises(ConfigError):
            parse_gpus(bad)


def test_auto_reads_nvidia_smi_listing_and_skips_mig_lines():
    listing = ("GPU 0: NVIDIA H200 (UUID: GPU-aaaa)\n"
               "  MIG 3g.71gb     Device  0: (UUID: MIG-bbbb)\n"
               "GPU 1: NVIDIA H200 (UUID: GPU-cccc)\n")
    assert gpus_from_listing(listing) == (0, 1)
    assert gpus_from_listing("No devices were found\n") == ()


def test_auto_without_nvidia_smi_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="nvidia-smi is not on PATH"):
        parse_gpus("auto")

import dataclasses
import os

import pytest

from trtpd.kv.errors import KvConnectError, KvProtocolError
from trtpd.kv.layout import KvLayout
from trtpd.kv.pool import SHM_DIR, KvPool
from trtpd.kv.shm_source import ShmPoolIdentity, ShmPoolSources, host_boot_id
from trtpd.kv.spans import pool_bytes

LAYOUT = KvLayout(num_layers=2, num_kv_heads=1, head_size=4, tokens_per_block=4, dtype="fp16")


@pytest.fixture
def shm_pool(tmp_path):
    name = f"trtpd_test_{os.getpid()}_{tmp_path.name}"
    pool = KvPool(LAYOUT, 3, shm_name=name)
    yield pool
    pool.close()
    assert not (SHM_DIR / name).exists()


def test_accept_payload_round_trip(shm_pool):
    identity = ShmPoolIdentity.of(shm_pool.shm_name, shm_pool.num_blocks)
    payload = identity.pack_accept([2, 0, 1])
    assert len(payload) == 36 + 3 * 4
    assert ShmPoolIdentity.unpack_accept(payload) == (identity, [2, 0, 1])
    with pytest.raises(KvProtocolError, match="malformed shm ACCEPT"):
        ShmPoolIdentity.unpack_accept(payload[:-1])


def test_maps_the_exporters_segment_read_only(shm_pool):
    pool_bytes(shm_pool)[:] = 7
    sources = ShmPoolSources()
    identity = ShmPoolIdentity.of(shm_pool.shm_name, shm_pool.num_blocks)
    source = sources.get(shm_pool.shm_name, identity, LAYOUT, "test")
    assert source.array.nbytes == shm_pool.nbytes and (source.array == 7).all()
    assert not source.array.flags.writeable
    assert sources.get(shm_pool.shm_name, identity, LAYOUT, "test") is source     # cached
    sources.close()


@pytest.mark.parametrize("change,match", [
    ({"inode": 1}, "not the exporter's segment"), ({"boot_id": b"x" * 16}, "another host"),
    ({"num_blocks": 4}, "announced 4 blocks")])
def test_refuses_a_segment_that_is_not_the_exporters(shm_pool, change, match):
    identity = dataclasses.replace(ShmPoolIdentity.of(shm_pool.shm_name, shm_pool.num_blocks), **change)
    with pytest.raises(KvConnectError, match=match):
        ShmPoolSources().get(shm_pool.shm_name, identity, LAYOUT, "KV pull of request 'r'")


def test_missing_segment_says_to_use_tcp():
    identity = ShmPoolIdentity(host_boot_id(), device=0, inode=0, num_blocks=1)
    with pytest.raises(KvConnectError, match="does not exist here.*use tcp"):
        ShmPoolSources().get("trtpd_test_missing_segment", identity, LAYOUT, "test")


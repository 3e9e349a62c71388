"""The gateway's disagg-cluster storage keeps upstream's semantics (HttpClusterStorageServer, TensorRT-LLM 1.2.1):
no overwrite unless asked, expiry by ttl renewed by heartbeats, a sweep that drops the expired."""

from __future__ import annotations

from trtpd.gateway.cluster_store import ClusterStore


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_set_get_delete_and_no_overwrite_unless_asked():
    store = ClusterStore(Clock())
    assert store.set("/k", "a") and not store.set("/k", "b") and store.get("/k") == "a"
    assert store.set("/k", "b", overwrite=True) and store.get("/k") == "b"
    assert store.delete("/k") and not store.delete("/k") and store.get("/k") is None


def test_a_key_expires_unless_its_heartbeat_renews_it():
    clock = Clock()
    store = ClusterStore(clock)
    store.set("/w/a", "x", ttl_s=10)
    store.set("/w/b", "y", ttl_s=10)
    store.set("/w/forever", "z")
    clock.now += 8
    assert store.expire("/w/a", 10)          # a heartbeat: 10 s more from now
    clock.now += 4
    version = store.version
    assert store.sweep() == ["/w/b"] and store.version > version
    assert store.get_prefix("/w/") == {"/w/a": "x", "/w/forever": "z"}
    assert not store.expire("/w/b", 10)      # gone: the worker must register again
    clock.now += 7
    assert store.get("/w/a") is None and store.get_prefix("/w/", keys_only=True) == {"/w/forever": ""}

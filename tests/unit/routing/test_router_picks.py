import pytest

from trtpd.routing.core import InstanceView, Route, Router, RoutingPolicy


def prefill(name, **kw):
    return InstanceView(name, "prefill", **kw)


def decode(name, free=100, max_blocks=100, **kw):
    return InstanceView(name, "decode", free_kv_blocks=free, max_kv_blocks=max_blocks, tokens_per_block=32, **kw)


def router(views, policy=RoutingPolicy()):
    r = Router(policy)
    r.update(views, 0.0)
    return r


# -- prefill: least queued prompt tokens ---------------------------------------------------------------
def test_prefill_goes_to_the_least_queued_prompt_tokens():
    r = router([prefill("prefill-0", queued_prompt_tokens=900), prefill("prefill-1", queued_prompt_tokens=100)])
    assert r.pick_prefill("a", 50, 0.0) == Route("a", "prefill-1", 1)


def test_router_counts_what_it_sent_between_snapshots():
    r = router([prefill("prefill-0"), prefill("prefill-1")])
    assert r.pick_prefill("a", 1000, 0.0).instance == "prefill-0"
    assert r.pick_prefill("b", 10, 0.1).instance == "prefill-1"     # prefill-0 holds a's 1000 tokens
    assert r.pick_prefill("c", 10, 0.2).instance == "prefill-1"     # 10 < 1000
    assert r.router_load("prefill-0").pending_prompt_tokens == 1000
    r.prefill_done("a")                                               # prefill-0 answered
    assert r.router_load("prefill-0").pending_prompt_tokens == 0
    assert r.pick_prefill("d", 10, 0.3).instance == "prefill-0"


def test_new_snapshot_adds_to_the_pending_tokens():
    r = router([prefill("prefill-0"), prefill("prefill-1")])
    r.pick_prefill("a", 500, 0.0)                                     # -> prefill-0
    r.update([prefill("prefill-0"), prefill("prefill-1", queued_prompt_tokens=800)], 1.0)
    assert r.router_load("prefill-0").pending_prompt_tokens == 500   # kept across update()
    assert r.pick_prefill("b", 10, 1.0).instance == "prefill-0"      # 500 < 800


def test_ties_go_by_name_numbers_as_numbers():
    r = router([prefill("prefill-10"), prefill("prefill-2"), prefill("prefill-1", queued_prompt_tokens=1)])
    assert r.pick_prefill("a", 0, 0.0).instance == "prefill-2"


def test_prefill_skips_an_instance_whose_kv_cannot_hold_the_prompt():
    r = router([prefill("prefill-0", max_kv_blocks=2, tokens_per_block=32), prefill("prefill-1", queued_prompt_tokens=99)])
    assert r.pick_prefill("a", 64, 0.0).instance == "prefill-0"
    r.release("a")
    assert r.pick_prefill("b", 65, 0.0).instance == "prefill-1"


# -- prefill: length buckets -------------------------------------------------------------------------
BUCKETS = RoutingPolicy(prefill_buckets=((512, ("prefill-0", "prefill-1")), (4096, ("prefill-2",))))


def test_a_long_prompt_never_goes_to_a_short_bucket_instance():
    r = router([prefill("prefill-0"), prefill("prefill-1"), prefill("prefill-2", queued_prompt_tokens=10**6)],
               BUCKETS)
    assert [r.pick_prefill(f"l{i}", 513, 0.0).instance for i in range(3)] == ["prefill-2"] * 3


def test_a_prompt_goes_to_the_first_bucket_that_fits_inclusive():
    r = router([prefill("prefill-0"), prefill("prefill-1"), prefill("prefill-2")], BUCKETS)
    assert r.pick_prefill("a", 512, 0.0).instance == "prefill-0"
    assert r.pick_prefill("b", 512, 0.0).instance == "prefill-1"
    assert r.pick_prefill("c", 4096, 0.0).instance == "prefill-2"
    assert r.pick_prefill("d", 4097, 0.0) is None          # longer than every bucket, nothing unbucketed


def test_unbucketed_instances_serve_every_length():
    r = router([prefill("prefill-0", queued_prompt_tokens=50), prefill("prefill-2", queued_prompt_tokens=50),
                prefill("prefill-9")], BUCKETS)
    assert r.pick_prefill("short", 10, 0.0).instance == "prefill-9"     # 0 < 50 at prefill-0 (prefill-1 absent)
    assert r.pick_prefill("mid", 1000, 0.0).instance == "prefill-9"     # 10 < 50 at prefill-2
    assert r.pick_prefill("mid2", 1000, 0.0).instance == "prefill-2"    # 50 < 1010
    assert r.pick_prefill("long", 100_000, 0.0).instance == "prefill-9"  # only unbucketed ones: 1010


def test_a_short_prompt_stays_in_its_group_unless_spill_is_on():
    views = [prefill("prefill-0", state="draining"), prefill("prefill-1", state="unhealthy"), prefill("prefill-2")]
    assert router(views, BUCKETS).pick_prefill("a", 10, 0.0) is None
    spill = RoutingPolicy(prefill_buckets=BUCKETS.prefill_buckets, spill_to_longer_buckets=True)
    assert router(views, spill).pick_prefill("a", 10, 0.0).instance == "prefill-2"
    # never down: a long prompt does not spill into a shorter bucket
    views = [prefill("prefill-0"), prefill("prefill-2", state="draining")]
    assert router(views, spill).pick_prefill("b", 1000, 0.0) is None


def test_bucket_policy_is_validated():
    with pytest.raises(ValueError, match="increasing"):
        RoutingPolicy(prefill_buckets=((4096, ("a",)), (512, ("b",))))
    with pytest.raises(ValueError, match="more than one bucket"):
        RoutingPolicy(prefill_buckets=((512, ("a",)), (4096, ("a",))))
    with pytest.raises(ValueError, match="tuple of names"):
        RoutingPolicy(prefill_buckets=((512, "prefill-0"),))
    with pytest.raises(ValueError, match="at least 1"):
        RoutingPolicy(max_prefill_attempts=0)


# -- states and exclusions ---------------------------------------------------------------------------
@pytest.mark.parametrize("state", ["draining", "unhealthy", "starting"])
def test_instances_not_ready_are_skipped(state):
    r = router([prefill("prefill-0", state=state), prefill("prefill-1", queued_prompt_tokens=10**6),
                decode("decode-0", state=state, free=1000), decode("decode-1", free=1)])
    assert r.pick_prefill("a", 10, 0.0).instance == "prefill-1"
    assert r.pick_decode("a", 10, 10, 0.0).instance == "decode-1"


def test_excluded_instances_are_skipped():
    r = router([prefill("prefill-0"), prefill("prefill-1", queued_prompt_tokens=99), decode("decode-0"),
                decode("decode-1", free=1)])
    assert r.pick_prefill("a", 10, 0.0, exclude=frozenset({"prefill-0"})).instance == "prefill-1"
    assert r.pick_decode("a", 10, 10, 0.0, exclude=frozenset({"decode-0"})).instance == "decode-1"


def test_no_instance_gives_none_and_leaves_no_record():
    r = Router()
    assert r.pick_prefill("a", 10, 0.0) is None
    assert r.pick_decode("a", 10, 10, 0.0) is None
    assert r.pick_colocated("a", 10, 10, 0.0) is None
    r.update([prefill("prefill-0", state="draining"), decode("decode-0", state="unhealthy")], 1.0)
    assert r.pick_prefill("a", 10, 1.0) is None and r.pick_decode("a", 10, 10, 1.0) is None
    assert r.num_tracked_requests == 0


def test_picks_only_use_their_own_role():
    r = router([decode("decode-0"), InstanceView("colocated-0", "colocated")])
    assert r.pick_prefill("a", 10, 0.0) is None
    assert r.pick_colocated("a", 10, 10, 0.0).instance == "colocated-0"
    assert r.pick_decode("b", 10, 10, 0.0).instance == "decode-0"


# -- decode: most free KV blocks ---------------------------------------------------------------------
def test_decode_goes_to_the_most_free_blocks_after_reservations():
    r = router([decode("decode-0", free=100), decode("decode-1", free=90)])
    assert r.pick_decode("a", 320, 0, 0.0).instance == "decode-0"      # reserves 10 blocks: 90 left
    assert r.router_load("decode-0").reserved_kv_blocks == 10
    # 90 vs 90: tie -> fewer active sequences (decode-0 has one sent by this router)
    assert r.pick_decode("b", 1, 0, 0.0).instance == "decode-1"         # reserves 1 block: 89 left
    assert r.pick_decode("c", 33, 0, 0.0).instance == "decode-0"        # 90 > 89; 33 tokens = 2 blocks


def test_decode_ties_go_to_fewer_active_then_name():
    r = router([decode("decode-1", active=2), decode("decode-2", active=1), decode("decode-10", active=1)])
    assert r.pick_decode("a", 10, 10, 0.0).instance == "decode-2"
    r = router([decode("decode-10"), decode("decode-2")])
    assert r.pick_decode("a", 10, 10, 0.0).instance == "decode-2"


def test_decode_reservation_counts_prompt_and_max_new_tokens():
    r = router([decode("decode-0", free=100)])
    r.pick_decode("a", 100, 29, 0.0)                                    # 129 tokens -> 5 blocks of 32
    assert r.router_load("decode-0").reserved_kv_blocks == 5


def test_decode_skips_an_instance_too_small_for_the_request():
    r = router([decode("decode-0", free=4, max_blocks=4), decode("decode-1", free=0, max_blocks=1000)])
    assert r.pick_decode("a", 100, 28, 0.0).instance == "decode-0"      # 128 tokens = 4 blocks: fits
    assert r.pick_decode("b", 100, 29, 0.0).instance == "decode-1"      # 5 blocks never fit decode-0
    assert router([decode("decode-0", free=4, max_blocks=4)]).pick_decode("c", 100, 29, 0.0) is None


def test_decode_with_unknown_capacity_is_not_refused():
    r = router([InstanceView("decode-0", "decode")])                     # max_kv_blocks 0: unknown
    assert r.pick_decode("a", 10**6, 10**6, 0.0).instance == "decode-0"


def test_decode_load_sequences_counts_active_waiting_and_sent():
    policy = RoutingPolicy(decode_load="sequences")
    r = router([decode("decode-0", free=1000, active=1, waiting=1), decode("decode-1", free=1, active=1)], policy)
    assert r.pick_decode("a", 10, 10, 0.0).instance == "decode-1"       # 1 < 2 sequences
    assert r.pick_decode("b", 10, 10, 0.0).instance == "decode-0"       # 2 vs 2: name
    r.release("a")
    assert r.pick_decode("c", 10, 10, 0.0).instance == "decode-1"


# -- colocated ---------------------------------------------------------------------------------------
def test_colocated_goes_to_the_least_queued_prompt_tokens_and_holds_kv_until_release():
    views = [InstanceView("colocated-0", "colocated", free_kv_blocks=100, max_kv_blocks=100),
             InstanceView("colocated-1", "colocated", queued_prompt_tokens=50, free_kv_blocks=100, max_kv_blocks=100)]
    r = router(views)
    assert r.pick_colocated("a", 100, 28, 0.0).instance == "colocated-0"
    assert r.router_load("colocated-0") == r.router_load("colocated-0").__class__(100, 4, 1)
    assert r.pick_colocated("b", 10, 10, 0.0).instance == "colocated-1"   # 50 < 100
    r.prefill_done("a")
    assert r.router_load("colocated-0").pending_prompt_tokens == 0
    assert r.router_load("colocated-0").reserved_kv_blocks == 4
    assert r.pick_colocated("c", 10, 10, 0.0).instance == "colocated-0"
    r.release("a")
    assert r.router_load("colocated-0").reserved_kv_blocks == 1
    assert r.pick_colocated("d", 4000, 1, 0.0) is None                     # 126 blocks > 100


def test_colocated_ties_go_to_the_instance_decoding_least_not_the_first_name():
    """In-flight batching computes a prompt within a step, so the queues are empty at most arrivals: the tie
    must spread the decode load (most free KV after reservations, then fewer sequences), or colocated-0
    takes every request while its peers idle."""
    views = [InstanceView(f"colocated-{i}", "colocated", free_kv_blocks=100, max_kv_blocks=100) for i in range(3)]
    r = router(views)
    picks = []
    for k in range(6):
        picks.append(r.pick_colocated(f"r{k}", 64, 64, 0.0).instance)
        r.prefill_done(f"r{k}")                # prompt computed: its queue is empty again, its KV held
    assert picks == ["colocated-0", "colocated-1", "colocated-2"] * 2
    r.release("r4")                            # colocated-1 now holds the least
    assert r.pick_colocated("s", 64, 64, 0.0).instance == "colocated-1"
    r = router([InstanceView("colocated-0", "colocated", queued_prompt_tokens=10, free_kv_blocks=100, max_kv_blocks=100),
                InstanceView("colocated-1", "colocated", free_kv_blocks=5, max_kv_blocks=100)])
    assert r.pick_colocated("t", 64, 64, 0.0).instance == "colocated-1"   # the queue still comes first


# -- round robin -------------------------------------------------------------------------------------
def test_round_robin_cycles_in_name_order_over_instances_that_can_take_the_request():
    r = router([prefill("prefill-1", queued_prompt_tokens=10**6), prefill("prefill-0"), prefill("prefill-2")],
               RoutingPolicy(balance="round_robin"))
    names = [r.pick_prefill(str(i), 10, 0.0).instance for i in range(4)]
    assert names == ["prefill-0", "prefill-1", "prefill-2", "prefill-0"]
    assert r.pick_prefill("x", 10, 0.0, exclude=frozenset({"prefill-0", "prefill-1", "prefill-2"})) is None


# -- bookkeeping -------------------------------------------------------------------------------------
def test_bookkeeping_never_goes_negative():
    r = router([prefill("prefill-0"), decode("decode-0")])
    r.pick_prefill("a", 100, 0.0)
    r.pick_decode("a", 100, 28, 0.0)
    for _ in range(2):
        r.prefill_done("a")
    assert r.router_load("prefill-0").pending_prompt_tokens == 0
    for _ in range(2):
        r.release("a")
    r.prefill_done("a")                      # after release: nothing to drop
    r.release("never-routed")
    r.prefill_done("never-routed")
    assert r.router_load("prefill-0") == r.router_load("decode-0") == r.router_load("nobody")
    assert r.router_load("decode-0").num_requests == 0 and r.num_tracked_requests == 0


def test_picking_again_replaces_the_request_s_reservation_and_counts_attempts():
    r = router([prefill("prefill-0"), prefill("prefill-1"), decode("decode-0"), decode("decode-1")])
    assert r.pick_prefill("a", 100, 0.0) == Route("a", "prefill-0", 1)
    assert r.pick_prefill("a", 100, 0.0, exclude=frozenset({"prefill-0"})) == Route("a", "prefill-1", 2)
    assert r.router_load("prefill-0").pending_prompt_tokens == 0
    assert r.router_load("prefill-1").pending_prompt_tokens == 100
    assert r.pick_decode("a", 100, 0, 0.0) == Route("a", "decode-0", 1)
    assert r.pick_decode("a", 100, 0, 0.0, exclude=frozenset({"decode-0"})) == Route("a", "decode-1", 2)
    assert r.router_load("decode-0").num_requests == 0 and r.router_load("decode-1").reserved_kv_blocks == 4
    r.release("a")
    assert all(r.router_load(n).reserved_kv_blocks == r.router_load(n).pending_prompt_tokens == 0
               for n in ("prefill-0", "prefill-1", "decode-0", "decode-1"))


def test_least_recent_tie_break_lets_idle_instances_take_turns():
    from trtpd.routing.core import InstanceView, Router, RoutingPolicy

    router = Router(RoutingPolicy(tie_break="least_recent"))
    views = [InstanceView(f"prefill-{i}", "prefill") for i in range(2)] + \
            [InstanceView(f"decode-{i}", "decode", free_kv_blocks=100, max_kv_blocks=100) for i in range(2)]
    router.update(views, 0.0)
    picked = []
    for i in range(4):   # sequential requests: each finishes before the next
        p = router.pick_prefill(f"r{i}", 10, 0.0)
        router.prefill_done(f"r{i}")
        d = router.pick_decode(f"r{i}", 10, 5, 0.0)
        router.release(f"r{i}")
        picked.append((p.instance, d.instance))
    assert picked == [("prefill-0", "decode-0"), ("prefill-1", "decode-1")] * 2
    by_name = Router()                     # the default keeps the first by name (reproducible simulations)
    by_name.update(views, 0.0)
    firsts = []
    for i in range(3):
        firsts.append(by_name.pick_prefill(f"q{i}", 10, 0.0).instance)
        by_name.release(f"q{i}")
    assert firsts == ["prefill-0"] * 3


def test_decode_started_drops_the_reservation_the_snapshot_now_counts():
    from trtpd.routing.core import InstanceView, Router

    router = Router()
    router.update([InstanceView("decode-0", "decode", free_kv_blocks=100, max_kv_blocks=100)], 0.0)
    router.pick_decode("r", 64, 64, 0.0)              # 4 blocks of 32 tokens reserved
    assert router.router_load("decode-0").reserved_kv_blocks == 4
    router.decode_started("r")
    assert router.router_load("decode-0").reserved_kv_blocks == 0 and router.router_load("decode-0").num_requests == 0
    router.release("r")                               # harmless afterwards
    assert router.num_tracked_requests == 0


def test_decode_stays_in_the_kv_domain_of_the_prefill_picked():
    """Triton MPI worlds: KV moves over MPI inside one world only, so a request prefilled in world-1 is decoded
    there even when world-0's decode has more free blocks; instances without a domain take any request."""
    views = [prefill("world-0.prefill", queued_prompt_tokens=500, kv_domain="world-0"),
             prefill("world-1.prefill", kv_domain="world-1"),
             decode("world-0.decode", free=100, kv_domain="world-0"), decode("world-1.decode", free=10,
                                                                               kv_domain="world-1")]
    r = router(views)
    assert r.pick_prefill("a", 10, 0.0).instance == "world-1.prefill"
    assert r.pick_decode("a", 10, 4, 0.0).instance == "world-1.decode"
    assert r.pick_decode("a", 10, 4, 0.0, exclude=frozenset({"world-1.decode"})) is None   # never world-0's
    plain = router([prefill("prefill-0"), decode("decode-0", free=10), decode("decode-1", free=100)])
    assert plain.pick_prefill("b", 10, 0.0).instance == "prefill-0"
    assert plain.pick_decode("b", 10, 4, 0.0).instance == "decode-1"

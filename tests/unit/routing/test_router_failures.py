import pytest

from trtpd.routing.core import InstanceView, Router, RoutingPolicy


def cluster(policy=RoutingPolicy(), num_prefill=3, num_decode=3):
    r = Router(policy)
    r.update([InstanceView(f"prefill-{i}", "prefill") for i in range(num_prefill)]
             + [InstanceView(f"decode-{i}", "decode", free_kv_blocks=100, max_kv_blocks=100)
                for i in range(num_decode)], 0.0)
    return r


def state(r, name):
    return {v.name: v.state for v in r.instances()}[name]


def test_prefill_gone_is_retried_elsewhere_then_fails_at_the_bound():
    r = cluster()
    route = r.pick_prefill("a", 100, 0.0)
    d = r.on_failure("a", "prefill", "unavailable", route.attempt, route.instance, 1.0)
    assert (d.action, d.exclude, d.error_kind) == ("retry_prefill", frozenset({"prefill-0"}), "unavailable")
    assert state(r, "prefill-0") == "unhealthy"
    assert r.router_load("prefill-0").pending_prompt_tokens == 0       # its queue is gone
    route = r.pick_prefill("a", 100, 1.0, exclude=d.exclude)
    assert (route.instance, route.attempt) == ("prefill-1", 2)
    d = r.on_failure("a", "prefill", "unavailable", route.attempt, route.instance, 2.0)
    assert d.action == "fail" and d.error_kind == "unavailable"
    assert d.exclude == frozenset({"prefill-0", "prefill-1"})
    assert "prefill" in d.message and "prefill-1" in d.message and "unavailable" in d.message
    assert "2 of 2" in d.message
    r.release("a")
    assert r.num_tracked_requests == 0


def test_kv_pull_failure_prefills_again_excluding_the_dead_prefill():
    r = cluster()
    p = r.pick_prefill("a", 100, 0.0)
    r.prefill_done("a")
    dec = r.pick_decode("a", 100, 10, 0.0)
    d = r.on_failure("a", "kv_pull", "unavailable", p.attempt, p.instance, 0.5)
    assert (d.action, d.exclude) == ("retry_prefill", frozenset({"prefill-0"}))
    assert state(r, "prefill-0") == "unhealthy" and state(r, dec.instance) == "ready"
    assert r.router_load(dec.instance).num_requests == 1          # the decode reservation stays for the retry
    assert r.pick_prefill("a", 100, 0.5).instance != "prefill-0"  # the router remembers the exclusion too
    d = r.on_failure("a", "kv_pull", "unavailable", 2, "prefill-1", 0.6)
    assert d.action == "fail" and "KV pull" in d.message and "prefill-1" in d.message


def test_decode_failure_fails_by_default_and_retries_when_allowed():
    r = cluster()
    r.pick_prefill("a", 100, 0.0)
    route = r.pick_decode("a", 100, 10, 0.0)
    d = r.on_failure("a", "decode", "unavailable", route.attempt, route.instance, 1.0)
    assert d.action == "fail" and d.error_kind == "unavailable"
    assert "decode" in d.message and "decode-0" in d.message and "first token" in d.message
    assert r.router_load("decode-0").num_requests == 0

    r = cluster(RoutingPolicy(max_decode_attempts=2))
    r.pick_decode("b", 100, 10, 0.0)
    d = r.on_failure("b", "decode", "unavailable", 1, "decode-0", 1.0)
    assert (d.action, d.exclude) == ("retry_decode", frozenset({"decode-0"}))
    assert r.pick_decode("b", 100, 10, 1.0, exclude=d.exclude).attempt == 2


def test_the_exclude_set_grows_across_stages():
    r = cluster(RoutingPolicy(max_prefill_attempts=3, max_decode_attempts=3))
    d1 = r.on_failure("a", "prefill", "unavailable", 1, r.pick_prefill("a", 10, 0.0).instance, 0.1)
    d2 = r.on_failure("a", "kv_pull", "unavailable", 2, r.pick_prefill("a", 10, 0.1, d1.exclude).instance, 0.2)
    r.pick_prefill("a", 10, 0.2, d2.exclude)
    d3 = r.on_failure("a", "decode", "internal", 1, r.pick_decode("a", 10, 10, 0.3).instance, 0.3)
    assert d1.exclude < d2.exclude < d3.exclude
    assert d3.exclude == frozenset({"prefill-0", "prefill-1", "decode-0"}) and d3.action == "retry_decode"


def test_internal_errors_are_retried_within_the_bound_without_marking_the_instance():
    r = cluster()
    route = r.pick_prefill("a", 10, 0.0)
    d = r.on_failure("a", "prefill", "internal", route.attempt, route.instance, 1.0)
    assert d.action == "retry_prefill" and state(r, "prefill-0") == "ready"
    d = r.on_failure("a", "prefill", "internal", 2, "prefill-1", 1.0)
    assert d.action == "fail" and d.error_kind == "internal" and "internal error" in d.message


@pytest.mark.parametrize("stage", ["prefill", "kv_pull", "decode"])
def test_invalid_arg_is_never_retried(stage):
    r = cluster(RoutingPolicy(max_prefill_attempts=5, max_decode_attempts=5))
    r.pick_prefill("a", 10, 0.0)
    r.pick_decode("a", 10, 10, 0.0)
    failed = "decode-0" if stage == "decode" else "prefill-0"
    d = r.on_failure("a", stage, "invalid_arg", 1, failed, 1.0)
    assert d.action == "fail" and d.error_kind == "invalid_arg"
    assert "invalid argument" in d.message and failed in d.message and "not retried" in d.message
    assert state(r, failed) == "ready"


def test_a_retry_with_no_other_instance_fails_now():
    r = cluster(RoutingPolicy(max_prefill_attempts=3, max_decode_attempts=3), num_prefill=1, num_decode=1)
    r.pick_prefill("a", 10, 0.0)
    d = r.on_failure("a", "prefill", "unavailable", 1, "prefill-0", 1.0)
    assert d.action == "fail" and d.error_kind == "unavailable"
    assert "no other prefill instance" in d.message and "prefill-0" in d.message
    r.pick_decode("b", 10, 10, 0.0)
    d = r.on_failure("b", "decode", "internal", 1, "decode-0", 1.0)
    assert d.action == "fail" and d.error_kind == "unavailable" and "no other decode instance" in d.message


def test_buckets_count_when_looking_for_another_prefill():
    policy = RoutingPolicy(prefill_buckets=((512, ("prefill-0", "prefill-1")),), max_prefill_attempts=3)
    r = cluster(policy)                  # prefill-2 unbucketed
    r.pick_prefill("long", 4000, 0.0)    # -> prefill-2, the only one for long prompts
    assert r.on_failure("long", "prefill", "unavailable", 1, "prefill-2", 1.0).action == "fail"
    r.pick_prefill("short", 10, 0.0)     # -> prefill-0; prefill-1 is left
    assert r.on_failure("short", "prefill", "unavailable", 1, "prefill-0", 1.0).action == "retry_prefill"


def test_colocated_failure_retries_on_another_colocated_instance():
    r = Router(RoutingPolicy(max_decode_attempts=2))
    r.update([InstanceView(f"colocated-{i}", "colocated", free_kv_blocks=10, max_kv_blocks=10) for i in range(2)], 0.0)
    route = r.pick_colocated("a", 10, 10, 0.0)
    d = r.on_failure("a", "decode", "unavailable", route.attempt, route.instance, 1.0)
    assert d.action == "retry_decode" and d.exclude == frozenset({"colocated-0"})
    assert r.router_load("colocated-0") == r.router_load("nobody")     # both its holds dropped
    assert r.pick_colocated("a", 10, 10, 1.0, d.exclude).instance == "colocated-1"


def test_an_unknown_request_still_gets_a_decision():
    r = cluster()
    d = r.on_failure("ghost", "prefill", "unavailable", 1, "prefill-0", 1.0)
    assert d.action == "retry_prefill" and state(r, "prefill-0") == "unhealthy"


def test_unknown_stage_or_kind_is_a_programming_error():
    r = cluster()
    with pytest.raises(ValueError, match="stage"):
        r.on_failure("a", "tokenize", "internal", 1, "prefill-0", 0.0)
    with pytest.raises(ValueError, match="error kind"):
        r.on_failure("a", "prefill", "timeout", 1, "prefill-0", 0.0)


def test_unhealthy_mark_outlives_a_snapshot_older_than_the_failure():
    r = cluster()
    r.on_failure("a", "prefill", "unavailable", 1, "prefill-0", 5.0)
    views = [InstanceView(f"prefill-{i}", "prefill") for i in range(3)]
    r.update(views, 4.0)                   # taken before the failure: cannot bring it back
    assert state(r, "prefill-0") == "unhealthy"
    r.update(views, 6.0)                   # later and it says ready: ready
    assert state(r, "prefill-0") == "ready"

import pytest

from trtpd.routing.core import InstanceView, Router


def views(**states):
    return [InstanceView(name.replace("_", "-"), "prefill", state=s) for name, s in states.items()]


def state(r):
    return {v.name: v.state for v in r.instances()}


def test_draining_is_sticky_across_updates_until_cleared():
    r = Router()
    r.update(views(prefill_0="ready", prefill_1="ready"), 0.0)
    r.set_state("prefill-0", "draining")
    assert r.pick_prefill("a", 10, 0.0).instance == "prefill-1"
    r.update(views(prefill_0="ready", prefill_1="ready"), 1.0)        # the instance still reports ready
    assert state(r)["prefill-0"] == "draining"
    r.set_state("prefill-0", "ready")                                  # the caller clears it
    assert state(r)["prefill-0"] == "ready"


def test_draining_ends_when_the_instance_leaves_the_snapshot():
    r = Router()
    r.update(views(prefill_0="ready"), 0.0)
    r.set_state("prefill-0", "draining")
    r.update([], 1.0)
    assert r.instances() == []
    r.update(views(prefill_0="ready"), 2.0)                           # a new instance under the old name
    assert state(r) == {"prefill-0": "ready"}


def test_set_state_unhealthy_lasts_until_the_next_update():
    r = Router()
    r.update(views(prefill_0="ready"), 0.0)
    r.set_state("prefill-0", "unhealthy")
    assert r.pick_prefill("a", 10, 0.0) is None
    r.update(views(prefill_0="ready"), 1.0)
    assert r.pick_prefill("a", 10, 1.0).instance == "prefill-0"


def test_ready_clears_the_override_but_the_snapshot_state_still_applies():
    r = Router()
    r.update(views(prefill_0="draining"), 0.0)                        # the instance itself drains
    r.set_state("prefill-0", "ready")
    assert state(r)["prefill-0"] == "draining"


def test_a_failure_does_not_undo_draining():
    r = Router()
    r.update(views(prefill_0="ready", prefill_1="ready"), 0.0)
    r.set_state("prefill-0", "draining")
    r.on_failure("a", "prefill", "unavailable", 1, "prefill-0", 1.0)
    r.update(views(prefill_0="ready", prefill_1="ready"), 2.0)
    assert state(r)["prefill-0"] == "draining"


def test_set_state_ignores_unknown_names_and_refuses_unknown_states():
    r = Router()
    r.update(views(prefill_0="ready"), 0.0)
    r.set_state("prefill-9", "draining")
    assert state(r) == {"prefill-0": "ready"}
    with pytest.raises(ValueError, match="unknown state"):
        r.set_state("prefill-0", "paused")


def test_instances_lists_the_snapshot_in_name_order_with_effective_states():
    r = Router()
    r.update(views(prefill_10="ready", prefill_2="starting", prefill_1="ready"), 0.0)
    r.set_state("prefill-1", "draining")
    assert [(v.name, v.state) for v in r.instances()] == [("prefill-1", "draining"), ("prefill-2", "starting"),
                                                           ("prefill-10", "ready")]


def test_update_refuses_a_name_twice_and_views_validate():
    with pytest.raises(ValueError, match="twice"):
        Router().update(views(prefill_0="ready") * 2, 0.0)
    with pytest.raises(ValueError, match="role"):
        InstanceView("x", "router")
    with pytest.raises(ValueError, match="state"):
        InstanceView("x", "decode", state="gone")

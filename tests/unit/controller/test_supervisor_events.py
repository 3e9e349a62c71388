"""supervisord's events as audit records: deaths (also within a second of a start) and restarts of the gateway and
the controller; a clean stop and the first start are not recorded (the live path: tests/e2e/test_controller.py)."""

from trtpd.controller import supervisor_events as ev


def test_deaths_and_restarts_are_recorded_and_clean_stops_are_not():
    ev._died.clear()
    first = {"processname": "controller", "from_state": "STARTING", "pid": "10"}
    assert ev.audit_event("d", "PROCESS_STATE_RUNNING", first) is None                  # the first start
    died = ev.audit_event("d", "PROCESS_STATE_EXITED", {"processname": "controller", "from_state": "RUNNING",
                                                         "expected": "0", "pid": "10"})
    assert died == {"action": "controller_died", "detail": {"pid": 10, "from_state": "RUNNING"}}
    again = ev.audit_event("d", "PROCESS_STATE_RUNNING", {**first, "pid": "11"})
    assert again == {"action": "controller_restarted", "detail": {"pid": 11, "from_state": "STARTING"}}
    assert ev.audit_event("d", "PROCESS_STATE_EXITED", {"processname": "controller", "expected": "1"}) is None
    early = ev.audit_event("d", "PROCESS_STATE_BACKOFF", {"processname": "gateway", "from_state": "STARTING"})
    assert early["action"] == "gateway_died" and early["detail"]["from_state"] == "STARTING"
    assert ev.audit_event("d", "PROCESS_STATE_FATAL", {"processname": "gateway"})["action"] == "gateway_gave_up"
    assert ev.audit_event("d", "PROCESS_STATE_EXITED", {"processname": "trtpd_audit", "expected": "0"}) is None


def test_a_death_before_the_first_running_state_makes_the_next_start_a_restart():
    """SIGKILL within a second of the start (supervisord's BACKOFF): the program never reached RUNNING, yet its
    next RUNNING is a restart."""
    ev._died.clear()
    assert ev.audit_event("d", "PROCESS_STATE_BACKOFF", {"processname": "controller", "from_state": "STARTING"})
    again = ev.audit_event("d", "PROCESS_STATE_RUNNING", {"processname": "controller", "from_state": "STARTING",
                                                          "pid": "12"})
    assert again["action"] == "controller_restarted" and again["detail"]["pid"] == 12
    assert ev.audit_event("d", "PROCESS_STATE_RUNNING", {"processname": "controller", "pid": "12"}) is None

"""A replacement started while its predecessor's stop still runs waits for the GPUs that stop frees."""

from __future__ import annotations

from trtpd.controller import local
from trtpd.serving import stub_watch


def test_a_start_waits_as_long_as_a_stop_can_take():
    """A stop is the server's stop (STOP_TIMEOUT_S, 0.5 s forced) and then its stubs' SIGKILL and exit
    (KILL_WAIT_S). At RELEASE_WAIT_S = 5 s a heal on a full GPU inventory failed in CI once with GpuShortage naming
    the dead instance's GPU, still being released, and succeeded a pass later."""
    stop_bound_s = max(local.STOP_TIMEOUT_S, local.FORCE_STOP_TIMEOUT_S) + stub_watch.KILL_WAIT_S
    assert local.RELEASE_WAIT_S > stop_bound_s

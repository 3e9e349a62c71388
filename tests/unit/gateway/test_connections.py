"""The connection bound sized from the open-file limit (the live behaviour is tests/e2e/test_gateway_attack.py)."""

import pytest

from trtpd.gateway.connections import ACCEPT_BACKLOG, FILE_RESERVE, MAX_AUTO_CONNECTIONS, connection_bound


def test_the_default_bound_leaves_room_for_an_accept_burst_and_the_gateways_own_files():
    assert connection_bound(None, 1024) == 1024 - 2 * ACCEPT_BACKLOG - FILE_RESERVE == 512
    assert connection_bound(None, 1_000_000) == MAX_AUTO_CONNECTIONS


def test_a_bound_the_limit_cannot_hold_is_refused_not_lowered():
    assert connection_bound(500, 1024) == 500
    with pytest.raises(ValueError, match="at least 1112"):
        connection_bound(600, 1024)
    with pytest.raises(ValueError, match="no room"):
        connection_bound(None, 400)

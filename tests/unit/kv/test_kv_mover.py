"""The byte movers' shared pieces: ACCEPT and hello payloads, the channel token, binding a channel to its pull."""

from __future__ import annotations

import threading

import pytest

from trtpd.kv import mover
from trtpd.kv.errors import KvProtocolError
from trtpd.kv.handle import generate_key


def test_accept_round_trip_carries_the_address_and_the_source_blocks():
    payload = mover.pack_accept(b"tag#0$port#41000$", [7, 0, 3])
    assert mover.unpack_accept(payload) == (b"tag#0$port#41000$", [7, 0, 3])


@pytest.mark.parametrize("payload", [b"", b"\x00", b"\x00\x09abc", b"\x00\x01a\x00\x00"])
def test_truncated_accept_is_a_protocol_error(payload):
    with pytest.raises(KvProtocolError, match="malformed mover ACCEPT"):
        mover.unpack_accept(payload)


def test_hello_round_trip():
    token = bytes(range(32))
    hello = mover.pack_hello(token, [4, 9, 1])
    assert mover.unpack_hello_head(hello[:mover.HELLO.size]) == (token, 3)
    assert mover.unpack_block_ids(hello[mover.HELLO.size:]) == [4, 9, 1]


def test_hello_announcing_absurdly_many_blocks_is_refused():
    with pytest.raises(KvProtocolError, match="announces"):
        mover.unpack_hello_head(mover.HELLO.pack(bytes(32), mover.MAX_BLOCKS + 1))


def test_channel_token_needs_the_key_and_is_fresh_per_pull():
    key, nonce_a, nonce_b = generate_key(), bytes(32), bytes([1]) * 32
    token = mover.channel_token(key, nonce_a, nonce_b)
    assert token == mover.channel_token(key, nonce_a, nonce_b) and len(token) == mover.TOKEN_BYTES
    assert token != mover.channel_token(generate_key(), nonce_a, nonce_b)      # another key
    assert token != mover.channel_token(key, nonce_b, nonce_a)                 # another pull
    with pytest.raises(ValueError):
        mover.channel_token(key, b"short", nonce_b)


def test_a_pending_pull_gets_the_channel_bound_to_its_token():
    table = mover.PendingTable()
    pending = table.expect(b"t" * 32)
    assert table.take(b"x" * 32) is None                       # a stranger's token binds nothing
    taken = table.take(b"t" * 32)
    assert taken is pending and table.take(b"t" * 32) is None  # a token binds once
    channel = object()
    threading.Timer(0.05, lambda: taken.bind(channel, [1, 2])).start()
    assert pending.wait(5.0) == (channel, [1, 2])


def test_a_pull_that_gave_up_refuses_a_late_channel():
    pending = mover.PendingTable().expect(b"t" * 32)
    with pytest.raises(TimeoutError, match="did not open its KV channel"):
        pending.wait(0.01)
    assert pending.bind(object(), [0]) is False                # the mover closes it

import socket
import threading

import numpy as np
import pytest

from trtpd.kv import frame
from trtpd.kv.endpoint import KvEndpoint
from trtpd.kv.errors import KvHandleMalformedError, KvProtocolError
from trtpd.kv.frame import Kind


def test_header_is_16_bytes_in_network_order():
    data = frame.pack_header(Kind.LAYER, payload_bytes=0x0102030405, code=0, layer=79)
    assert frame.HEADER_BYTES == 16
    assert data == b"TKV2" + bytes([3, 0]) + (79).to_bytes(2, "big") + (0x0102030405).to_bytes(8, "big")
    assert frame.unpack_header(data) == (Kind.LAYER, 0, 79, 0x0102030405)


@pytest.mark.parametrize("data", [b"HTTP" + bytes(12), b"TKV1" + bytes([99]) + bytes(11)])
def test_bad_header_is_a_protocol_error(data):
    with pytest.raises(KvProtocolError, match="not a trtpd KV frame"):
        frame.unpack_header(data)


def test_recv_frame_refuses_an_oversized_payload():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(frame.pack_header(Kind.DONE, payload_bytes=1 << 40))
        with pytest.raises(KvProtocolError, match="more than the 8"):
            frame.recv_frame(b, max_payload_bytes=8)


def test_gather_send_and_scatter_receive_many_buffers_through_small_socket_buffers():
    rng = np.random.default_rng(0)
    sizes = [int(s) for s in rng.integers(0, 5000, size=frame.MAX_IOV * 2 + 7)]   # more than one sendmsg batch
    src = [rng.integers(0, 256, size=s, dtype=np.uint8) for s in sizes]
    dst = [np.zeros(s, dtype=np.uint8) for s in sizes[::-1]]       # different split on the receiving side
    a, b = socket.socketpair()
    with a, b:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)     # forces partial sends and receives
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sender = threading.Thread(target=lambda: frame.send_buffers(a, [memoryview(x) for x in src]))
        sender.start()
        assert frame.recv_into_buffers(b, [memoryview(x) for x in dst]) == sum(sizes)
        sender.join(timeout=10)
    assert np.array_equal(np.concatenate(src), np.concatenate(dst))


def test_receive_reports_a_closed_peer():
    a, b = socket.socketpair()
    with b:
        a.sendall(b"abc")
        a.close()
        with pytest.raises(ConnectionError, match="5 bytes still expected"):
            frame.recv_into_buffers(b, [memoryview(bytearray(8))])


@pytest.mark.parametrize("text", ["tcp://127.0.0.1:41000", "shm://127.0.0.1:5/trtpd_pool_a", "tcp://[::1]:7",
                                  "ucx://127.0.0.1:41000", "mpi://10.0.0.5:9"])
def test_endpoint_round_trip(text):
    assert str(KvEndpoint.parse(text)) == text


@pytest.mark.parametrize("text", ["127.0.0.1:41000", "udp://h:1", "tcp://h:port", "shm://h:1", "tcp://h:1/x", "ucx://h:1/x", ""])
def test_bad_endpoint_is_malformed(text):
    with pytest.raises(KvHandleMalformedError, match="is not tcp://HOST:PORT"):
        KvEndpoint.parse(text)

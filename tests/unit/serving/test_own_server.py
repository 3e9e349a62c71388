"""The single server's entry finds its own tritonserver's gRPC endpoint on the server's command line."""

from __future__ import annotations

import os
import pytest

from trtpd.serving.own_server import OwnServerError, grpc_url_from_argv, own_grpc_url


def test_the_flags_trtpd_starts_tritonserver_with():
    argv = ["--model-repository=/r", "--grpc-address=127.0.0.1", "--http-port=18000", "--grpc-port=18001"]
    assert grpc_url_from_argv(argv) == "127.0.0.1:18001"


def test_space_separated_flags_and_the_last_one_wins():
    assert grpc_url_from_argv(["--grpc-port", "9001", "--log-verbose", "0", "--grpc-port", "9101"]) == \
        "127.0.0.1:9101"


def test_tritons_defaults_when_no_flag_is_given():
    """A server started by hand (the GPU container's launch without --grpc-port) listens on 0.0.0.0:8001."""
    assert grpc_url_from_argv(["--model-repository=/models"]) == "127.0.0.1:8001"
    assert grpc_url_from_argv(["--grpc-address=::"]) == "127.0.0.1:8001"
    assert grpc_url_from_argv(["--grpc-address=::1", "--grpc-port=7001"]) == "[::1]:7001"


def test_a_server_without_grpc_or_with_a_bad_port_is_named():
    with pytest.raises(OwnServerError, match="--allow-grpc=false"):
        grpc_url_from_argv(["--allow-grpc=false"])
    with pytest.raises(OwnServerError, match="--grpc-port is 'x'"):
        grpc_url_from_argv(["--grpc-port=x"])


def test_it_reads_a_processs_command_line_from_proc():
    """This test's own process stands in for tritonserver: pytest was not given --grpc-port, so Triton's default;
    a process that is gone is named."""
    assert own_grpc_url(os.getpid()) == "127.0.0.1:8001"
    with pytest.raises(OwnServerError, match="cannot read the command line of tritonserver"):
        own_grpc_url(2 ** 22 + 12345)

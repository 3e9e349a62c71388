"""The version check before a real build: it refuses a container that does not ship the pinned stack and
names the image that does (docs/containers.md), never the one it refuses."""

from __future__ import annotations

import re

import pytest

from trtpd.trtllm.containers import CONTAINERS, DEFAULT_CONTAINER
from trtpd.trtllm.environment import BuildEnvironment, TrtllmUnavailableError, require_runnable
from trtpd.trtllm.versions import PINNED

GPUS = ["NVIDIA H100 80GB HBM3"] * 4


def refusal(env: BuildEnvironment) -> str:
    with pytest.raises(TrtllmUnavailableError) as caught:
        require_runnable(env, 1)
    return str(caught.value)


def images_named(message: str) -> set[str]:
    return set(re.findall(r"nvcr\.io/nvidia/[\w./-]+:[\w.-]+", message))


def test_the_1_1_0_of_the_25_12_trtllm_image_is_refused_with_an_image_that_ships_1_2_1():
    # tritonserver:25.12-trtllm-python-py3 ships TensorRT-LLM 1.1.0 (server docs/introduction/compatibility.md)
    message = refusal(BuildEnvironment("1.1.0", GPUS, "10.13.3.9"))
    assert "tensorrt_llm 1.1.0 is installed" in message
    assert CONTAINERS[DEFAULT_CONTAINER].image in message
    assert "25.12" not in message                       # the image the user is in is never the advice
    named = images_named(message)
    assert named and named <= {c.image for c in CONTAINERS.values()}
    assert all(c.tensorrt_llm == PINNED.tensorrt_llm for c in CONTAINERS.values())


@pytest.mark.parametrize("version", ["1.2.0", "1.2.0rc6.post2", "1.3.0rc14", "1.2.1.post1"])
def test_only_the_pinned_release_builds(version):
    message = refusal(BuildEnvironment(version, GPUS))
    assert f"tensorrt_llm {version} is installed" in message and f"pinned to {PINNED.tensorrt_llm}" in message
    assert CONTAINERS[DEFAULT_CONTAINER].image in message


def test_a_tensorrt_other_than_the_serving_images_is_refused():
    message = refusal(BuildEnvironment(PINNED.tensorrt_llm, GPUS, "10.13.3.9"))
    assert "TensorRT 10.13.3.9" in message and PINNED.tensorrt in message
    assert "do not deserialize" in message and CONTAINERS[DEFAULT_CONTAINER].image in message


@pytest.mark.parametrize("tensorrt", [None, "10.14.1.48", "10.14.1.48.post1"])
def test_the_pinned_stack_passes(tensorrt):
    require_runnable(BuildEnvironment(PINNED.tensorrt_llm, GPUS, tensorrt), 4)


def test_missing_tensorrt_llm_names_the_images():
    message = refusal(BuildEnvironment(None, []))
    assert "tensorrt_llm is not importable" in message and CONTAINERS[DEFAULT_CONTAINER].image in message

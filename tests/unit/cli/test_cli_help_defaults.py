"""Every default shows in --help."""

from __future__ import annotations

import argparse
import pytest

from trtpd.cli.main import COMMANDS, build_parser


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    return build_parser().get_default("command_parsers")


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")      # argparse wraps at the terminal's width


def help_of(command: str) -> str:
    return command_parsers()[command].format_help()


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_with_a_default_says_so(command):
    parser = command_parsers()[command]
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or action.default in (None, False, argparse.SUPPRESS):
            continue
        flag = action.option_strings[-1]
        assert action.help, f"trtpd {command} {flag}: no help line, so its default {action.default!r} is not shown"
        shown = formatter._expand_help(action)
        assert "default" in shown and shown in help_of(command), f"trtpd {command} {flag}: {shown!r}"


@pytest.mark.parametrize("command, expected", [
    ("plan", "--weight-dtype {fp32,fp16,bf16,fp8} weight dtype (default: fp8, or the hardware profile's own when it has no fp8 figure)"),
    ("plan", "--kv-dtype {fp16,bf16,fp8} KV cache dtype (default: fp8, or the KV dtype of the hardware profile's measured curves for the model when it has none at fp8)"),
    ("plan", "configs/workloads name or YAML path (default: chat-powerlaw)"),
    ("plan", "requests per verification run (default: 6000)"),
    ("plan", "T_overhead in the TTFT equation (default: 0.1)"),
    ("build", "(default: fp8 for tensorrtllm, as the recipe says; fp16 for reference)"),
    ("build", "--backend {tensorrtllm,reference}"),
    ("build", "the CPU reference engines (default: tensorrtllm)"),
    ("build", "--modelopt-dir DIR checkout of NVIDIA/Model-Optimizer at tag 0.37.0 (the nvidia-modelopt TensorRT-LLM "
              "1.2.1 installs) whose examples/llm_ptq/hf_ptq.py makes deploy/serve-pytorch/'s FP8 checkpoint"),
    ("build", "serve-pytorch/: the same servers on the PyTorch backend, no engine, which --configs-only writes without "
              "a GPU"),
    ("simulate", "--decode-max-batch-size DECODE_MAX_BATCH_SIZE (default: the plan's, else 64)"),
    ("simulate", "configs/workloads name or YAML path (default: chat-powerlaw)"),
    ("profile", "(default: cpu-reference.yaml, in the current directory)"),
    ("demo", "requests per second (default: 3.0)"),
    ("up", "disaggregated: prefill instances (default: 1)"),
])
def test_named_defaults_appear(command, expected):
    assert expected in " ".join(help_of(command).split())   # a flag and its help may be on two lines


def test_profile_help_says_the_installed_profiles_are_never_changed():
    assert "the profiles installed with trtpd are never changed" in help_of("profile")

"""Every bad flag value: one line naming the flag, the value and what is allowed; exit status 2; no traceback."""

from __future__ import annotations

import pytest

BAD_VALUES = [
    (["plan", "--attainment", "90"], "trtpd plan: error: --attainment 90: must be a fraction in (0, 1), e.g. 0.9"),
    (["plan", "--attainment", "0"], "trtpd plan: error: --attainment 0: must be a fraction in (0, 1), e.g. 0.9"),
    (["plan", "--ttft-s", "-1"], "trtpd plan: error: --ttft-s -1: must be a positive number"),
    (["plan", "--tpot-s", "50"], "trtpd plan: error: --tpot-s 50: a TPOT of 50 s is implausible "
                                 "(the value is in seconds, at most 10); did you mean 0.05?"),
    (["plan", "--ttft-s", "900"], "trtpd plan: error: --ttft-s 900: a TTFT of 900 s is implausible "
                                  "(the value is in seconds, at most 600); did you mean 0.9?"),
    (["plan", "--rate-per-s", "abc"], "trtpd plan: error: --rate-per-s abc: expected a number"),
    (["plan", "--rate-per-s", "0"], "trtpd plan: error: --rate-per-s 0: must be a positive number"),
    (["plan", "--max-gpus", "2.5"], "trtpd plan: error: --max-gpus 2.5: expected an integer"),
    (["plan", "--tp-prefill", "0,2"], "trtpd plan: error: --tp-prefill 0,2: every value must be a positive integer"),
    (["plan", "--tp-decode", "a,b"], "trtpd plan: error: --tp-decode a,b: expected comma-separated integers, "
                                     "e.g. 1,2,4,8"),
    (["plan", "--method", "magic"], "trtpd plan: error: --method magic: invalid choice (choose from 'search', "
                                    "'seed004')"),
    (["plan", "--kv-dtype", "int4"], "trtpd plan: error: --kv-dtype int4: invalid choice (choose from 'fp16', "
                                     "'bf16', 'fp8')"),
    (["plan", "--decode-tpot-s", "20"], "trtpd plan: error: --decode-tpot-s 20: a TPOT of 20 s is implausible "
                                        "(the value is in seconds, at most 10); did you mean 0.02?"),
    (["simulate", "--num-requests", "0"], "trtpd simulate: error: --num-requests 0: must be a positive integer"),
    (["simulate", "--kv-link-latency-s", "-1"], "trtpd simulate: error: --kv-link-latency-s -1: must be a number >= 0"),
    (["build", "--model", "llama-2-70b", "--decode-tp", "0"],
     "trtpd build: error: --decode-tp 0: must be a positive integer"),
    (["build", "--model", "llama-2-70b", "--http-port", "70000"],
     "trtpd build: error: --http-port 70000: must be a TCP port in 1..65535"),
    (["build"], "trtpd build: error: the following arguments are required: --model"),
    (["up", "--grpc-port", "0"], "trtpd up: error: --grpc-port 0: must be a TCP port in 1..65535"),
    (["up", "--decode-instances", "-1"], "trtpd up: error: --decode-instances -1: must be a positive integer"),
    (["render", "-o", "x", "--kv-transfer-timeout-ms", "0"],
     "trtpd render: error: --kv-transfer-timeout-ms 0: must be a positive integer"),
    (["bench", "--rate", "-3"], "trtpd bench: error: --rate -3: must be a positive number"),
    (["demo", "--num-requests", "x"], "trtpd demo: error: --num-requests x: expected an integer"),
    (["profile", "--engine-dir", "e", "--repeats", "0"], "trtpd profile: error: --repeats 0: must be a positive integer"),
    (["lint", "--max-prompt-tokens", "-5"], "trtpd lint: error: --max-prompt-tokens -5: must be a positive integer"),
    (["plan", "--rate-per-s", "5", "--tokens-per-min", "5"],
     "trtpd plan: error: --tokens-per-min not allowed with argument --rate-per-s"),
]


@pytest.mark.parametrize("argv, line", BAD_VALUES, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_bad_value_is_one_line_with_status_2(trtpd, argv, line):
    code, out, err = trtpd(*argv)
    assert code == 2
    assert err.splitlines() == [line]
    assert out == ""


def test_a_good_value_next_to_the_boundary_is_accepted(trtpd):
    code, out, _ = trtpd("plan", "--rate-per-s", "5", "--attainment", "0.99", "--tpot-s", "10", "--no-verify")
    assert code == 0 and "for 99% of requests" in out


def test_an_invalid_field_from_a_library_call_is_one_line(trtpd, monkeypatch):
    """A pydantic ValidationError that escapes a command is caught at the CLI boundary."""
    from trtpd.cli import plan
    from trtpd.planner.inputs import Slo

    monkeypatch.setattr(plan, "run", lambda args: Slo(ttft_s=-1, tpot_s=0.05))
    monkeypatch.setattr(plan, "register", _register_with(plan))
    code, _, err = trtpd("plan")
    assert code == 2
    assert err.splitlines() == ["trtpd plan: error: invalid Slo: ttft_s: Input should be greater than 0"]


def _register_with(module):
    original = module.register

    def register(sub):
        original(sub)
        sub.choices["plan"].set_defaults(func=module.run)
    return register

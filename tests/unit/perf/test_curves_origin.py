"""trtpd plan and simulate say which machine a hardware profile's measured curves come from (issue 24, item 4)."""

from trtpd.perf.hardware import curves_origin, load_hardware, this_host


def test_the_bundled_cpu_profile_names_its_machine_and_whether_it_is_this_one():
    hardware = load_hardware("cpu-reference")
    origin = curves_origin(hardware, "tiny-llama")
    entry = hardware.find_measured("tiny-llama", 1, "fp16")
    assert entry.host in origin and entry.measured_at in origin
    if entry.host == this_host():       # the machine it was profiled on (or one with its name, CPU and cores)
        assert origin.endswith("; this machine")
    else:
        assert "not this machine" in origin and this_host() in origin


def test_a_profile_from_another_machine_says_so():
    hardware = load_hardware("cpu-reference")
    there = hardware.model_copy(update={"measured": [m.model_copy(update={"host": "elsewhere (Some CPU, 64 cores)"})
                                                     for m in hardware.measured]})
    origin = curves_origin(there, "tiny-llama")
    assert "elsewhere (Some CPU, 64 cores)" in origin and "not this machine" in origin and this_host() in origin


def test_curves_profiled_here_say_so():
    hardware = load_hardware("cpu-reference")
    here = hardware.model_copy(update={"measured": [m.model_copy(update={"host": this_host()})
                                                    for m in hardware.measured]})
    assert curves_origin(here, "tiny-llama").endswith("; this machine")


def test_a_model_without_measured_curves_has_no_origin():
    assert curves_origin(load_hardware("cpu-reference"), "llama-2-70b") is None
    assert curves_origin(load_hardware("h100-sxm"), "llama-2-70b") is None


def test_this_host_names_the_cpu_and_the_cores():
    host = this_host()
    assert host.endswith(" cores)") and "(" in host


def test_the_default_weight_dtype_is_the_hardwares_own_when_it_lacks_the_preferred_one():
    assert load_hardware("cpu-reference").default_weight_dtype("fp8") == "fp32"
    assert load_hardware("h100-sxm").default_weight_dtype("fp8") == "fp8"
    assert load_hardware("h100-sxm").default_weight_dtype("fp16") == "fp16"


def test_curves_at_another_kv_dtype_are_not_the_origin_and_the_default_kv_dtype_is_the_measured_one():
    """The perf model looks curves up by model, TP and KV dtype: cpu-reference's are fp16, so a plan at fp8 KV ran
    on the roofline while its report said the curves were measured on a machine."""
    hardware = load_hardware("cpu-reference")
    assert curves_origin(hardware, "tiny-llama", "fp16") == curves_origin(hardware, "tiny-llama")
    assert curves_origin(hardware, "tiny-llama", "fp8") is None
    assert hardware.default_kv_dtype("tiny-llama", "fp8") == "fp16"
    assert hardware.default_kv_dtype("llama-2-70b", "fp8") == "fp8"            # no curves for it: as asked
    assert load_hardware("h100-sxm-aiconfigurator").default_kv_dtype("llama-3.1-70b", "fp8") == "fp8"

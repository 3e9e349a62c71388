import pytest

from trtpd.cli.main import main
from trtpd.errors import ConfigError
from trtpd.perf.hardware import load_hardware
from trtpd.perf.profiling import (EngineLimits, ProfileGrid, batch_prompt_lens, feasible_grid, measure_profile,
                                  with_measured)

LIMITS = EngineLimits(prefill_max_num_tokens=2048, decode_max_batch_size=16, decode_max_seq_len=1600,
                      decode_kv_capacity_tokens=16 * 600)


def fake_prefill_s(lens):
    return 0.001 + 1e-5 * sum(lens)


def fake_decode_s(batch, ctx):
    return 0.002 + 1e-4 * batch + 1e-7 * batch * ctx


def test_batch_prompt_lens_split_evenly():
    assert batch_prompt_lens(3000, 1024) == [1000, 1000, 1000]
    assert batch_prompt_lens(100, 1024) == [100]
    assert sum(batch_prompt_lens(2049, 1024)) == 2049


def test_grid_respects_engine_limits():
    tokens, batches, contexts = feasible_grid(ProfileGrid(), LIMITS)
    assert max(tokens) <= 2048 and max(batches) <= 16
    assert max(batches) * (max(contexts) + 1) <= LIMITS.decode_kv_capacity_tokens
    with pytest.raises(ConfigError):
        feasible_grid(ProfileGrid(prefill_num_tokens=(4096,)), LIMITS)


def test_measured_profile_reproduces_the_measurements():
    prof = measure_profile(fake_prefill_s, fake_decode_s, ProfileGrid(), LIMITS, "tiny-llama", "fp16")
    assert prof.kv_capacity_tokens == 9600
    for t, latency in zip(prof.prefill.num_tokens, prof.prefill.latency_s):
        assert latency == pytest.approx(fake_prefill_s([t]))
    for b, row in zip(prof.decode.batch_sizes, prof.decode.step_latency_s):
        assert row == pytest.approx([fake_decode_s(b, c) for c in prof.decode.context_lens])
    again = with_measured([prof], prof.model_copy(update={"host": "b"}))
    assert len(again) == 1 and again[0].host == "b"


def _engine_folder(path, role, **sizes):
    from trtpd.engine.engine_config import EngineConfig
    path.mkdir(parents=True)
    EngineConfig(model="tiny-llama", role=role, kv_dtype="fp16", **sizes).save(path)


def test_profile_cli_writes_the_hardware_profile(tmp_path, monkeypatch, capsys):
    root = tmp_path / "reference-fp16"
    _engine_folder(root / "prefill-tp1", "prefill", max_batch_size=8, max_num_tokens=4096, max_input_len=1500,
                   max_seq_len=1564, num_kv_blocks=800)
    _engine_folder(root / "decode-tp1", "decode", max_batch_size=32, max_num_tokens=32, max_input_len=1500,
                   max_seq_len=1564, num_kv_blocks=1600)
    import trtpd.engine.profiling as profiling
    monkeypatch.setattr(profiling, "measure_prefill_s", lambda engine_dir, lens, repeats=3: fake_prefill_s(lens))
    monkeypatch.setattr(profiling, "measure_decode_step_s",
                        lambda engine_dir, batch, ctx, repeats=3: fake_decode_s(batch, ctx))
    out = tmp_path / "cpu.yaml"
    assert main(["profile", "--engine-dir", str(root), "--output", str(out), "--quick"]) == 0
    hw = load_hardware(str(out))
    (prof,) = hw.measured
    assert prof.model == "tiny-llama" and prof.kv_capacity_tokens == 1600 * 32
    assert prof.prefill.latency_s[0] == pytest.approx(fake_prefill_s([64]))
    assert "wrote" in capsys.readouterr().out


def test_serving_overhead_adds_to_measured_decode_steps():
    from trtpd.perf.measured import DecodeGrid, MeasuredPerfModel, MeasuredProfile, PrefillCurve, ServingOverhead

    profile = MeasuredProfile(model="tiny-llama", prefill=PrefillCurve(num_tokens=[1, 1000], latency_s=[0.001, 0.1]),
                              decode=DecodeGrid(batch_sizes=[1, 8], context_lens=[64, 512],
                                                step_latency_s=[[0.002, 0.003], [0.004, 0.006]]))
    plain = MeasuredPerfModel(profile)
    served = MeasuredPerfModel(profile, ServingOverhead(response_latency_s=0.01, step_overhead_s=0.0005,
                                                        per_sequence_step_s=0.0002))
    assert served.decode_step_s(8, 8 * 64) == pytest.approx(plain.decode_step_s(8, 8 * 64) + 0.0005 + 8 * 0.0002)
    assert served.prefill_s(500) == plain.prefill_s(500)


# ---- long prompts: the attention a prompt's length adds ------------------------------------------------------
def attention_prefill_s(lens):
    """A fake engine whose attention grows with each prompt's length squared (the reference CPU engine: one prompt
    of 1,024 tokens takes 3x 16 prompts of 64)."""
    return 0.001 + 1e-4 * sum(lens) + 3e-7 * sum(n * n for n in lens)


LONG_LIMITS = EngineLimits(prefill_max_num_tokens=4096, decode_max_batch_size=16, decode_max_seq_len=1600,
                           decode_kv_capacity_tokens=16 * 600, prefill_max_input_len=1500)


def test_the_profile_measures_single_long_prompts_up_to_the_engines_longest():
    asked = []
    prof = measure_profile(lambda lens: asked.append(list(lens)) or attention_prefill_s(lens), fake_decode_s,
                           ProfileGrid(), LONG_LIMITS, "tiny-llama", "fp16")
    p = prof.prefill
    assert p.prompt_tokens == ProfileGrid().max_prompt_tokens
    assert all(max(lens) <= p.prompt_tokens for lens in asked[:len(p.num_tokens)])   # the curve: short prompts
    assert p.single_prompt_tokens == [128, 256, 384, 512, 640, 768, 896, 1024, 1280, 1500]   # then one prompt each
    assert asked[len(p.num_tokens):] == [[n] for n in p.single_prompt_tokens]
    assert p.single_latency_s == pytest.approx([attention_prefill_s([n]) for n in p.single_prompt_tokens])
    without = EngineLimits(**{**LONG_LIMITS.__dict__, "prefill_max_input_len": None})
    assert measure_profile(attention_prefill_s, fake_decode_s, ProfileGrid(), without, "m", "fp16"
                           ).prefill.single_prompt_tokens == []


@pytest.mark.parametrize("lens", [[1500], [1000], [700, 700], [300] * 8, [900, 200, 150], [64] * 16, [1500, 553]])
def test_a_batchs_prefill_follows_how_its_tokens_split_into_prompts(lens):
    """The measured model against the fake engine: the same tokens cost what their prompts' lengths make them cost
    (a batch read by its tokens alone puts one prompt of 1,500 at the cost of 23 prompts of 64: 2.4x short)."""
    from trtpd.perf.measured import MeasuredPerfModel

    prof = measure_profile(attention_prefill_s, fake_decode_s, ProfileGrid(), LONG_LIMITS, "tiny-llama", "fp16")
    model = MeasuredPerfModel(prof)
    tokens, sum_sq = sum(lens), sum(n * n for n in lens)
    equal = len(set(lens)) == 1
    assert model.prefill_s(tokens, sum_sq) == pytest.approx(attention_prefill_s(lens), rel=0.02 if equal else 0.15)


def test_a_profile_without_single_prompts_reads_the_curve_as_before():
    from trtpd.perf.measured import DecodeGrid, MeasuredPerfModel, MeasuredProfile, PrefillCurve

    decode = DecodeGrid(batch_sizes=[1], context_lens=[64], step_latency_s=[[0.002]])
    old = MeasuredPerfModel(MeasuredProfile(model="m", decode=decode,
                                            prefill=PrefillCurve(num_tokens=[64, 1024], latency_s=[0.01, 0.2])))
    assert old.prefill_s(1024, 1024 * 1024) == old.prefill_s(1024) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="needs prompt_tokens"):
        PrefillCurve(num_tokens=[64], latency_s=[0.01], single_prompt_tokens=[512], single_latency_s=[0.1])
    with pytest.raises(ValueError, match="longer than prompt_tokens"):
        PrefillCurve(num_tokens=[64], latency_s=[0.01], prompt_tokens=64, single_prompt_tokens=[64],
                     single_latency_s=[0.1])


def test_a_slow_spell_reaches_one_pass_not_the_profile():
    """Points are measured in passes over the whole grid and each is the median of its passes: a spell during
    which the machine runs at half speed (here the whole second pass) leaves the profile as it is. Measured back to
    back (one pass), the same spell doubles every point it covers."""
    grid = ProfileGrid.quick()
    calls = {"n": 0}
    points = len(grid.prefill_num_tokens) + 2 + len(grid.decode_batch_sizes) * len(grid.decode_context_lens)

    def slow_in_second_pass(f):
        def measure(*args):
            calls["n"] += 1
            spell = points < calls["n"] <= 2 * points
            return f(*args) * (2.0 if spell else 1.0)
        return measure

    limits = EngineLimits(**{**LONG_LIMITS.__dict__, "prefill_max_input_len": 1024})
    steady = measure_profile(attention_prefill_s, fake_decode_s, grid, limits, "m", "fp16")
    assert len(steady.prefill.single_prompt_tokens) == 2
    spelled = measure_profile(slow_in_second_pass(attention_prefill_s), slow_in_second_pass(fake_decode_s), grid,
                              limits, "m", "fp16", passes=3)
    assert calls["n"] == 3 * points
    assert spelled.prefill == steady.prefill and spelled.decode == steady.decode
    calls["n"] = points      # the next calls are the spell's
    back_to_back = measure_profile(slow_in_second_pass(attention_prefill_s), slow_in_second_pass(fake_decode_s),
                                   grid, limits, "m", "fp16")
    assert back_to_back.prefill.latency_s == pytest.approx([2 * v for v in steady.prefill.latency_s])

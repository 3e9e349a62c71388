"""One bad request fails alone: a fault injected in add, forward or sampling fails that request with its
cause, frees its KV blocks, and its batch neighbours produce exactly the tokens of a clean run."""

from __future__ import annotations

import math
import threading
import time

import pytest

from trtpd.engine.loader import KvTransferOptions, load_engine
from trtpd.engine.loop import EngineLoop
from trtpd.engine.request import EngineRequest, RequestType
from trtpd.engine.sampler import SamplingParams, sample
import trtpd.engine.generation_engine as generation_engine
import trtpd.engine.prefill_engine as prefill_engine

POISON = 7   # a prompt holding this token makes the injected forward fault fire
PROMPTS = {"a": [5, 9, 11, 13, 17], "b": [21, 22, 23, 24, 25, 26, 27, 28, 29], "c": [31, 37, 41]}
MAX_NEW = 6


class Collector:
    def __init__(self):
        self.outputs: dict[str, list] = {}
        self.cond = threading.Condition()

    def __call__(self, out):
        with self.cond:
            self.outputs.setdefault(out.request_id, []).append(out)
            self.cond.notify_all()

    def tokens(self, rid):
        return [t for o in self.outputs.get(rid, []) for t in o.new_token_ids]

    def final(self, rid):
        return next((o for o in reversed(self.outputs.get(rid, [])) if o.finished), None)

    def wait_finished(self, rids, timeout_s=60.0):
        with self.cond:
            ok = self.cond.wait_for(lambda: all(any(o.finished for o in self.outputs.get(r, [])) for r in rids),
                                    timeout_s)
        assert ok, f"no final output for {[r for r in rids if r not in self.outputs]} in {timeout_s} s"


def wait_until(pred, what, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError(f"{what}: not within {timeout_s} s")


@pytest.fixture
def coloc(fp16_root):
    loaded = load_engine(fp16_root / "colocated-tp1")
    yield loaded
    loaded.close()


def run_colocated(loaded, prompts, sampling=None, timeout_s=60.0):
    """Submits all prompts at once (so they share steps) and returns the collector."""
    c = Collector()
    loop = EngineLoop(loaded.engine, c)
    try:
        for rid, prompt in prompts.items():
            loop.submit(EngineRequest(rid, prompt, MAX_NEW, sampling=(sampling or {}).get(rid, SamplingParams()),
                                      arrival_s=time.monotonic()))
        c.wait_finished(list(prompts), timeout_s)
        wait_until(lambda: loaded.engine.stats()["waiting"] == 0 and loaded.engine.stats()["active"] == 0,
                   "the scheduler empties")
    finally:
        loop.stop()
    return c


def poisoned_forward(model, monkeypatch):
    real = model.forward

    def forward(chunks, pool, **kw):
        if any(POISON in c.token_ids for c in chunks):
            raise RuntimeError("injected forward fault")
        return real(chunks, pool, **kw)
    monkeypatch.setattr(model, "forward", forward)


def assert_neighbours_clean(clean, faulty, rids):
    for rid in rids:
        assert faulty.tokens(rid) == clean.tokens(rid), rid
        assert len(clean.tokens(rid)) == MAX_NEW


def assert_failed(c, rid, cause):
    final = c.final(rid)
    assert final is not None and final.finish_reason == "error", c.outputs.get(rid)
    assert cause in final.error and rid in final.error, final.error


def test_colocated_forward_fault_fails_only_the_culprit(coloc, monkeypatch):
    baseline = coloc.engine.stats()["free_blocks"]
    clean = run_colocated(coloc, PROMPTS)
    poisoned_forward(coloc.model, monkeypatch)
    faulty = run_colocated(coloc, {**PROMPTS, "bad": [3, POISON, 4]})
    assert_failed(faulty, "bad", "injected forward fault")
    assert_neighbours_clean(clean, faulty, PROMPTS)
    assert coloc.engine.stats()["free_blocks"] == baseline


def test_colocated_decode_step_fault_midway(coloc, monkeypatch):
    """The poison token is generated, not prompted: the fault fires in a decode step of a running batch."""
    baseline = coloc.engine.stats()["free_blocks"]
    clean = run_colocated(coloc, PROMPTS)
    target = clean.tokens("b")[2]
    real = coloc.model.forward
    monkeypatch.setattr(coloc.model, "forward", lambda chunks, pool, **kw: (_ for _ in ()).throw(
        RuntimeError("injected decode fault")) if any(c.token_ids == [target] for c in chunks) else real(chunks, pool, **kw))
    others = {k: v for k, v in PROMPTS.items() if target not in clean.tokens(k)[:-1]}
    faulty = run_colocated(coloc, PROMPTS)
    assert_failed(faulty, "b", "injected decode fault")
    assert faulty.tokens("b") == clean.tokens("b")[:3]
    assert_neighbours_clean(clean, faulty, [r for r in others if r != "b"])
    assert coloc.engine.stats()["free_blocks"] == baseline


def test_sampling_fault_fails_one_row(coloc, monkeypatch):
    baseline = coloc.engine.stats()["free_blocks"]
    clean = run_colocated(coloc, PROMPTS)
    marked = SamplingParams(top_k=1, seed=424242)   # greedy, like the others, but recognisable

    def flaky(logits, params, position, banned=()):
        if params == marked:
            raise FloatingPointError("injected sampling fault")
        return sample(logits, params, position, banned)
    monkeypatch.setattr(generation_engine, "sample", flaky)
    faulty = run_colocated(coloc, {**PROMPTS, "bad": [3, 4, 5, 6]}, sampling={"bad": marked})
    assert_failed(faulty, "bad", "injected sampling fault")
    assert_neighbours_clean(clean, faulty, PROMPTS)
    assert coloc.engine.stats()["free_blocks"] == baseline


def test_add_fault_fails_that_request_and_the_loop_serves_on(coloc, monkeypatch):
    baseline = coloc.engine.stats()["free_blocks"]
    clean = run_colocated(coloc, PROMPTS)
    real_add = coloc.engine.add

    def add(request):
        if request.request_id == "bad":
            raise MemoryError("injected add fault")
        real_add(request)
    monkeypatch.setattr(coloc.engine, "add", add)
    faulty = run_colocated(coloc, {"bad": [1, 2, 3], **PROMPTS})
    assert_failed(faulty, "bad", "injected add fault")
    assert_neighbours_clean(clean, faulty, PROMPTS)
    assert coloc.engine.stats()["free_blocks"] == baseline


def test_a_failing_step_fails_the_requests_in_flight_instead_of_spinning(coloc, monkeypatch):
    baseline = coloc.engine.stats()["free_blocks"]
    real_schedule = coloc.engine.scheduler.schedule
    calls = []

    def schedule():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected scheduler fault")
        return real_schedule()
    monkeypatch.setattr(coloc.engine.scheduler, "schedule", schedule)
    faulty = run_colocated(coloc, {"x": PROMPTS["a"]})
    assert_failed(faulty, "x", "injected scheduler fault")
    monkeypatch.setattr(coloc.engine.scheduler, "schedule", real_schedule)
    again = run_colocated(coloc, {"y": PROMPTS["a"]})
    assert len(again.tokens("y")) == MAX_NEW
    assert coloc.engine.stats()["free_blocks"] == baseline


@pytest.mark.parametrize("temperature", [1e-40, 1e-6])
def test_tiny_temperature_is_greedy(coloc, temperature):
    clean = run_colocated(coloc, PROMPTS)
    tiny = run_colocated(coloc, PROMPTS, sampling={k: SamplingParams(temperature=temperature, seed=3) for k in PROMPTS})
    assert_neighbours_clean(clean, tiny, PROMPTS)


@pytest.mark.parametrize("value", [math.nan, math.inf, -0.5])
def test_non_finite_temperature_is_refused(value):
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        SamplingParams(temperature=value)


# ---- prefill ---------------------------------------------------------------------------------------

@pytest.fixture
def prefill(fp16_root, tmp_path):
    kv = KvTransferOptions(transport="shm", key_file=tmp_path / "kv.key", timeout_ms=30000)
    loaded = load_engine(fp16_root / "prefill-tp1", kv)
    yield loaded
    loaded.close()


def run_prefill(loaded, prompts, sampling=None):
    """Submits all prompts at once (they form one batch) and returns the collector once all are answered."""
    c = Collector()
    loop = EngineLoop(loaded.engine, c)
    try:
        for rid, prompt in prompts.items():
            loop.submit(EngineRequest(rid, prompt, MAX_NEW, RequestType.CONTEXT_ONLY,
                                      sampling=(sampling or {}).get(rid, SamplingParams()),
                                      arrival_s=time.monotonic()))
        c.wait_finished(list(prompts))
    finally:
        loop.stop()
    return c


def release_exports(loaded, rids):
    """Stands in for decode: the completed exports are dropped, and the engine frees their blocks."""
    for rid in rids:
        loaded.engine.exporter.fail(rid, "test done")
    loaded.engine.step()


def freed(loaded, baseline) -> bool:
    loaded.engine.step()   # frees the blocks of released exports
    return loaded.engine.stats()["free_blocks"] == baseline


def test_prefill_forward_fault_fails_only_the_culprit(prefill, monkeypatch):
    baseline = prefill.engine.stats()["free_blocks"]
    clean = run_prefill(prefill, PROMPTS)
    release_exports(prefill, PROMPTS)
    poisoned_forward(prefill.model, monkeypatch)
    faulty = run_prefill(prefill, {**PROMPTS, "bad": [3, POISON, 4]})
    assert_failed(faulty, "bad", "injected forward fault")
    for rid in PROMPTS:
        assert faulty.tokens(rid) == clean.tokens(rid) and len(clean.tokens(rid)) == 1
        assert faulty.final(rid).context_phase_params
    release_exports(prefill, PROMPTS)
    wait_until(lambda: freed(prefill, baseline), "prefill frees every block")


def test_prefill_sampling_fault_fails_one_row(prefill, monkeypatch):
    baseline = prefill.engine.stats()["free_blocks"]
    clean = run_prefill(prefill, PROMPTS)
    release_exports(prefill, PROMPTS)
    marked = SamplingParams(top_k=1, seed=99)

    def flaky(logits, params, position, banned=()):
        if params == marked:
            raise FloatingPointError("injected sampling fault")
        return sample(logits, params, position, banned)
    monkeypatch.setattr(prefill_engine, "sample", flaky)
    faulty = run_prefill(prefill, {**PROMPTS, "bad": [3, 4, 5]}, sampling={"bad": marked})
    assert_failed(faulty, "bad", "injected sampling fault")
    for rid in PROMPTS:
        assert faulty.tokens(rid) == clean.tokens(rid)
    release_exports(prefill, PROMPTS)
    wait_until(lambda: freed(prefill, baseline), "prefill frees every block")

"""The reference decoder: paged KV is read back exactly, and rows never depend on their batch."""

import pytest
import torch

from trtpd.catalog import get_model
from trtpd.engine.model import LlamaModel, SeqChunk, init_weights
from trtpd.engine.row_tiles import TILE_ROWS, row_counts_to_check
from trtpd.kv.layout import KvLayout
from trtpd.kv.pool import KvPool

SPEC = get_model("tiny-llama")


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    w = init_weights(SPEC, 0)
    return LlamaModel(SPEC, w, [0.02] * SPEC.num_layers, [0.02] * SPEC.num_layers)


def prompts(seed=0, lengths=(300, 7, 65, 1)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, SPEC.vocab_size, (n,), generator=g).tolist() for n in lengths]


def generate(model, pool, prompt, table, steps):
    out = [int(model.forward([SeqChunk(prompt, 0, table)], pool)[0].argmax())]
    for i in range(steps):
        out.append(int(model.forward([SeqChunk([out[-1]], len(prompt) + i, table)], pool)[0].argmax()))
    return out


def test_batch_invariance_holds_on_this_machine(model):
    report = model.check_batch_invariance(4096)
    assert report.ok, report.problems
    assert report.max_rows == 4096 and report.tile_rows == TILE_ROWS


def test_row_counts_cover_every_tail_and_the_largest_pass():
    counts = row_counts_to_check(4096)
    assert counts[:2 * TILE_ROWS + 1] == list(range(1, 2 * TILE_ROWS + 2))
    assert counts[-1] == 4096 and 4 * TILE_ROWS + 1 in counts
    assert row_counts_to_check(5) == [1, 2, 3, 4, 5]


def _coupled(x, weight):
    """Deliberately not batch-invariant: every row picks up a trace of the other rows in its tile."""
    return torch.nn.functional.linear(x, weight) + 1e-6 * x.sum(0, keepdim=True).mean()


def _position_dependent(x, weight):
    """Deliberately not batch-invariant: a row's result depends on its position in the tile."""
    out = torch.nn.functional.linear(x, weight)
    return out + 1e-6 * torch.arange(x.shape[0], dtype=out.dtype).unsqueeze(1)


@pytest.mark.parametrize("kernel", [_coupled, _position_dependent])
def test_the_check_catches_a_non_invariant_kernel(model, kernel):
    bad = LlamaModel(SPEC, model.w, model.k_scales, model.v_scales, linear=kernel)
    report = bad.check_batch_invariance(64)
    assert not report.ok
    assert {p.split(":")[0] for p in report.problems} == {"qkv projection", "output projection + MLP", "LM head"}
    assert "differ from the same rows computed alone" in report.problems[0]


def test_a_mixed_batch_of_every_tail_size_gives_each_row_its_solo_logits(model):
    """Forward passes of 1..2 tiles + 1 rows: decode rows next to a prefill, every row bit-exact."""
    pool = KvPool(KvLayout.for_model(SPEC, "fp16", 32), 256)
    ps = prompts(lengths=(40,) + (1,) * (2 * TILE_ROWS))
    tables = [list(range(i * 4, i * 4 + 4)) for i in range(len(ps))]
    solo = [model.forward([SeqChunk(p, 0, t)], pool)[0] for p, t in zip(ps, tables)]
    for n in (1, 2, TILE_ROWS - 1, TILE_ROWS, TILE_ROWS + 1, 2 * TILE_ROWS + 1):
        batched = model.forward([SeqChunk(p, 0, t) for p, t in zip(ps[:n], tables[:n])], pool)
        assert all(torch.equal(batched[i], solo[i]) for i in range(n)), n


@pytest.mark.parametrize("dtype", ["fp16", "fp8"])
def test_batched_prefill_and_decode_equal_one_sequence_at_a_time(model, dtype):
    pool = KvPool(KvLayout.for_model(SPEC, dtype, 32), 128)
    ps = prompts()
    tables = [list(range(i * 16, i * 16 + 16)) for i in range(len(ps))]
    solo = [model.forward([SeqChunk(p, 0, t)], pool)[0] for p, t in zip(ps, tables)]
    batched = model.forward([SeqChunk(p, 0, t) for p, t in zip(ps, tables)], pool)
    assert all(torch.equal(batched[i], solo[i]) for i in range(len(ps)))
    firsts = [int(s.argmax()) for s in solo]
    solo_dec = [model.forward([SeqChunk([f], len(p), t)], pool)[0] for f, p, t in zip(firsts, ps, tables)]
    batched_dec = model.forward([SeqChunk([f], len(p), t) for f, p, t in zip(firsts, ps, tables)], pool)
    assert all(torch.equal(batched_dec[i], solo_dec[i]) for i in range(len(ps)))


def test_scattered_block_table_equals_contiguous(model):
    prompt = prompts(lengths=(200,))[0]
    pool = KvPool(KvLayout.for_model(SPEC, "fp16", 32), 64)
    contiguous = generate(model, pool, prompt, list(range(8)), 10)
    scattered = generate(model, pool, prompt, [40, 3, 17, 60, 9, 22, 31, 50], 10)
    assert scattered == contiguous


def test_corrupting_one_cached_block_changes_the_output(model):
    """The context matters: a wrong KV block must show (so transfer bugs cannot hide). The corruption is
    seeded and the check is on the logits, so it holds on every run (12 greedy tokens can hide it)."""
    prompt = prompts(lengths=(200,))[0]
    pool = KvPool(KvLayout.for_model(SPEC, "fp16", 32), 16)
    table = list(range(8))
    model.forward([SeqChunk(prompt, 0, table)], pool)
    last = SeqChunk(prompt[-1:], len(prompt) - 1, table)
    clean = model.forward([last], pool)[0]
    gen = torch.Generator().manual_seed(7)
    block = pool.layers[1][2]        # block 2 of layer 1: tokens 64..95
    block.copy_(torch.randn(block.shape, generator=gen).to(block.dtype))
    corrupted = model.forward([last], pool)[0]
    assert float((corrupted - clean).abs().max()) > 1e-2


def test_fp8_cache_stores_one_byte_per_element_and_stays_close(model):
    prompt = prompts(lengths=(120,))[0]
    k_amax, v_amax = model.kv_amax(prompt)
    fp8 = LlamaModel(SPEC, model.w, [a / 448 for a in k_amax], [a / 448 for a in v_amax])
    pool16 = KvPool(KvLayout.for_model(SPEC, "fp16", 32), 8)
    pool8 = KvPool(KvLayout.for_model(SPEC, "fp8", 32), 8)
    assert pool8.nbytes * 2 == pool16.nbytes
    a = model.forward([SeqChunk(prompt, 0, list(range(4)))], pool16)[0]
    b = fp8.forward([SeqChunk(prompt, 0, list(range(4)))], pool8)[0]
    assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.99

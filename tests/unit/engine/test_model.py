"""The reference decoder: paged KV is read back exactly, and rows never depend on their batch."""

import pytest
import torch

from trtpd.catalog import get_model
from trtpd.engine.model import LlamaModel, SeqChunk, check_batch_invariance, init_weights
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


def test_batch_invariance_holds_on_this_machine():
    assert check_batch_invariance(SPEC, init_weights(SPEC, 0)) == []


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
    """The context matters: a wrong KV block must show (so transfer bugs cannot hide)."""
    prompt = prompts(lengths=(200,))[0]
    pool = KvPool(KvLayout.for_model(SPEC, "fp16", 32), 16)
    table = list(range(8))
    clean = generate(model, pool, prompt, table, 12)
    model.forward([SeqChunk(prompt, 0, table)], pool)
    pool.layers[1][2].normal_()   # block 2 of layer 1: tokens 64..95
    first = int(model.forward([SeqChunk(prompt[-1:], len(prompt) - 1, table)], pool)[0].argmax())
    out = [first]
    for i in range(12):
        out.append(int(model.forward([SeqChunk([out[-1]], len(prompt) + i, table)], pool)[0].argmax()))
    assert out != clean


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

"""The streaming detokenization rule (trtpd/detokenize.py), stateless: each chunk's text from its own tokens and the
tokens before it. Two SentencePiece-style tokenizers whose pieces carry "▁": a Unigram with a Metaspace
pre-tokenizer and decoder trained here (Hugging Face's generic decode), and trtpd's reference tokenizer in
Llama-2's scheme (BPE, byte fallback, decoded byte by byte). Decoding a chunk alone drops its leading space;
the deltas concatenate to the whole decode, however the stream is cut."""

from __future__ import annotations

import random

import pytest

from trtpd import detokenize
from trtpd.detokenize import text_delta
from trtpd.engine import corpus
from trtpd.engine.tokenizer import BYTE_BASE, SPACE, Tokenizer

TEXT = "The prefill server sends the cache to the decode server, 42 blocks."


def unigram_metaspace(folder) -> Tokenizer:
    """A tiny SentencePiece-style Unigram model ("▁" pieces, Metaspace decoder that strips the first space)."""
    from tokenizers import Tokenizer as Hf
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = Hf(models.Unigram())
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always")
    hf.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always")
    hf.train_from_iterator([corpus.training_corpus()], trainers.UnigramTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>", show_progress=False))
    hf.save(str(folder / "tokenizer.json"))
    return Tokenizer.load(folder / "tokenizer.json")


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory) -> Tokenizer:
    tok = unigram_metaspace(tmp_path_factory.mktemp("unigram"))
    assert tok.piece_bytes is None   # the generic path: the library's own decoder
    return tok


@pytest.fixture(scope="module")
def llama() -> Tokenizer:
    return Tokenizer.train(corpus.training_corpus(), 1536)


def stream(tok, ids, sizes):
    """Each chunk's text as a stateless receiver makes it: from the chunk and every token before it."""
    chunks, at = [], 0
    for size in sizes:
        new = ids[at:at + size]
        chunks.append(text_delta(tok, ids[:at], new, is_final=at + size >= len(ids)))
        at += size
    assert at >= len(ids)
    return chunks


def cut(ids, size):
    return [size] * (len(ids) // size + (len(ids) % size > 0))


@pytest.mark.parametrize("name", ["sentencepiece", "llama"])
@pytest.mark.parametrize("size", [1, 2, 3])
def test_chunk_deltas_concatenate_to_the_whole_decode_with_its_spaces(request, name, size):
    tok = request.getfixturevalue(name)
    ids = tok.encode(TEXT, add_bos=False)
    assert sum(tok.token_text(i).startswith(SPACE) for i in ids) > 5
    alone = "".join(tok.decode(ids[i:i + size]) for i in range(0, len(ids), size))
    assert alone.count(" ") < TEXT.count(" ")          # decoded alone, a chunk loses its leading space
    chunks = stream(tok, ids, cut(ids, size))
    assert "".join(chunks) == TEXT == tok.decode(ids)
    assert any(c.startswith(" ") for c in chunks)


@pytest.mark.parametrize("name", ["sentencepiece", "llama"])
def test_a_piece_keeps_its_space_after_the_tokens_before_it(request, name):
    tok = request.getfixturevalue(name)
    ids = tok.encode("The prefill server", add_bos=False)
    assert tok.token_text(ids[1]).startswith(SPACE)
    assert tok.decode([ids[1]]) == text_delta(tok, [], [ids[1]], is_final=True) == tok.decode(ids[1:2])
    assert text_delta(tok, ids[:1], [ids[1]], is_final=False).startswith(" ")
    assert text_delta(tok, [], ids[:1], is_final=False) == "The"   # the completion's first piece: no space


def test_a_character_split_across_byte_tokens_is_held_back_until_complete(llama):
    ids = llama.encode("ok 日本語 🚀", add_bos=False)
    byte_tokens = [i for i in ids if BYTE_BASE <= i < BYTE_BASE + 256]
    assert len(byte_tokens) >= 4                       # 🚀 at least is four byte tokens
    chunks = stream(llama, ids, [1] * len(ids))
    assert "".join(chunks) == "ok 日本語 🚀"
    assert not any("\ufffd" in c for c in chunks)
    assert chunks.count("") >= 3                       # the lead bytes waited for the rest of their character


def test_an_incomplete_character_at_the_end_comes_out_with_is_final(llama):
    ids = llama.encode("ok", add_bos=False) + [BYTE_BASE + 0xE6, BYTE_BASE + 0x97]   # a truncated 3-byte character
    assert text_delta(llama, ids[:-1], ids[-1:], is_final=False) == ""
    assert text_delta(llama, ids[:-1], ids[-1:], is_final=True) == "\ufffd"
    assert text_delta(llama, ids, [], is_final=True) == "\ufffd"      # an empty last chunk flushes it too
    assert "".join(stream(llama, ids, [1] * len(ids))) == llama.decode(ids) == "ok\ufffd"


@pytest.mark.parametrize("name", ["sentencepiece", "llama"])
def test_the_tail_widens_over_a_run_of_tokens_without_text(request, name):
    """Special tokens decode to "": the tail decoded is widened until it has text, so the space before the next
    piece is kept after earlier text and dropped at the completion's start, as the whole decode does."""
    tok = request.getfixturevalue(name)
    special = tok.bos_id                              # <s>, a special token: it decodes to ""
    word = tok.encode("server", add_bos=False)
    assert tok.decode([special]) == "" and tok.token_text(word[0]).startswith(SPACE)
    text = tok.encode("The prefill", add_bos=False)
    run = [special] * (3 * detokenize.CONTEXT_TOKENS)
    assert text_delta(tok, text + run, word, is_final=True) == " server"
    assert text_delta(tok, run, word, is_final=True) == "server"
    assert "".join(stream(tok, text + run + word, [1] * len(text + run + word))) == "The prefill server"


@pytest.mark.parametrize("context_tokens", [1, 2, detokenize.CONTEXT_TOKENS])
def test_random_token_streams_cut_anywhere_concatenate_to_the_whole_decode(llama, monkeypatch, context_tokens):
    """A sampled (untrained) model emits byte tokens that never form a character, special tokens and pieces in
    any order; whatever the tail's first width, the chunks concatenate to the whole decode."""
    monkeypatch.setattr(detokenize, "CONTEXT_TOKENS", context_tokens)
    rng = random.Random(11)
    for trial in range(150):
        ids = [rng.choice([rng.randrange(0, 3), rng.randrange(3, 259), rng.randrange(3, 259),
                           rng.randrange(259, llama.vocab_size)]) for _ in range(rng.randrange(1, 40))]
        sizes = [rng.randrange(1, 5) for _ in ids]
        at, cuts = 0, []
        for s in sizes:
            if at >= len(ids):
                break
            cuts.append(s)
            at += s
        assert "".join(stream(llama, ids, cuts)) == llama.decode(ids), (trial, ids, cuts)

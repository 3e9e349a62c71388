"""Streaming detokenization over the reference tokenizer (SentencePiece-style "▁" pieces, byte fallback):
chunks concatenate to the full text, spaces survive, no U+FFFD mid-character, stop strings cut."""

import pytest

from trtpd.engine import corpus
from trtpd.engine.tokenizer import BYTE_BASE, Tokenizer
from trtpd.gateway.detok import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(corpus.training_corpus(), 1536)


def stream(det, ids, step=1):
    chunks = [det.add(ids[i:i + step]) for i in range(0, len(ids), step)]
    return chunks + [det.finish()]


def test_pieces_streamed_one_by_one_keep_their_spaces(tok):
    text = "The prefill server sends the cache to the decode server, 42 blocks."
    ids = tok.encode(text, add_bos=False)
    assert any(tok.token_text(i).startswith("\u2581") for i in ids[1:])
    # decoding one "▁piece" alone drops its space (Llama's decoder strips the leading one): the naive way loses it
    assert "".join(tok.decode([i]) for i in ids) != text
    chunks = stream(IncrementalDetokenizer(tok), ids)
    assert "".join(chunks) == text == tok.decode(ids)
    assert any(c.startswith(" ") for c in chunks)


def test_a_character_split_across_tokens_never_shows_as_replacement(tok):
    text = "naïve café — 日本語 ✓ 🚀"
    ids = tok.encode(text, add_bos=False)
    assert any(BYTE_BASE <= i < BYTE_BASE + 256 for i in ids)   # byte fallback: characters span tokens
    chunks = stream(IncrementalDetokenizer(tok), ids)
    assert "".join(chunks) == text
    assert not any("\ufffd" in c for c in chunks)


def test_invalid_bytes_that_never_complete_are_flushed_at_the_end(tok):
    ids = tok.encode("ok", add_bos=False) + [BYTE_BASE + 0xE6, BYTE_BASE + 0x97]   # a truncated 3-byte character
    det = IncrementalDetokenizer(tok)
    chunks = stream(det, ids)
    assert "".join(chunks) == tok.decode(ids) == det.text
    assert det.text.startswith("ok") and det.text.endswith("\ufffd")


def test_a_stop_string_ends_the_text_before_it_even_across_chunks(tok):
    det = IncrementalDetokenizer(tok, stop=["END", "\n\n"])
    ids = tok.encode("abc END more", add_bos=False)
    assert len(ids) > 4   # "END" spans tokens: its pieces arrive in different steps
    chunks = stream(det, ids, step=2)
    assert "".join(chunks) == "abc " and det.stopped
    assert "E" not in "".join(chunks[:-1])   # the partial stop string was held back, never streamed


def test_a_held_back_prefix_that_does_not_become_a_stop_string_is_released(tok):
    det = IncrementalDetokenizer(tok, stop=["ENDING"])
    assert "".join(stream(det, tok.encode("the END of it", add_bos=False))) == "the END of it" and not det.stopped


def test_random_token_sequences_stream_the_whole_decode(tok):
    """A sampled (untrained) model emits byte tokens that never form a character, in any order: streaming never
    fails and the chunks always concatenate to the whole decode (tokenizers' DecodeStream raised here)."""
    import random

    rng = random.Random(5)
    for trial in range(200):
        ids = [rng.choice([rng.randrange(3, 259), rng.randrange(259, tok.vocab_size)]) for _ in range(40)]
        det = IncrementalDetokenizer(tok)
        assert "".join(stream(det, ids, step=rng.choice([1, 2, 3]))) == tok.decode(ids), trial


def test_a_byte_level_bpe_tokenizer_streams_through_the_window_decoder(tmp_path):
    """Tokenizers outside Llama's scheme (GPT-2/Llama-3 byte-level BPE) stream through the prefix-offset window."""
    from tokenizers import Tokenizer as Hf
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = Hf(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.train_from_iterator([corpus.training_corpus()], trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.load(tmp_path / "tokenizer.json")
    assert tok.piece_bytes is None
    text = "Decode the cache, then stream: naïve café 日本語 🚀 done."
    ids = tok.encode(text, add_bos=False)
    det = IncrementalDetokenizer(tok)
    chunks = stream(det, ids)
    assert "".join(chunks) == text == tok.decode(ids) and not any("\ufffd" in c for c in chunks)


def test_a_unigram_sentencepiece_tokenizer_keeps_its_spaces(tmp_path):
    """A SentencePiece-style Unigram ("▁" pieces, Metaspace decoder), decoded by the library's own decoder."""
    from tests.unit.test_detokenize import TEXT, unigram_metaspace

    sp = unigram_metaspace(tmp_path)
    ids = sp.encode(TEXT, add_bos=False)
    assert "".join(sp.decode([i]) for i in ids) != TEXT
    chunks = stream(IncrementalDetokenizer(sp), ids)
    assert "".join(chunks) == TEXT == sp.decode(ids) and any(c.startswith(" ") for c in chunks)


@pytest.mark.parametrize("step", [1, 2, 5])
def test_the_gateway_streams_what_the_stateless_rule_gives_each_chunk(tok, step):
    """One rule for both faces (trtpd/detokenize.py): the gateway's chunks, stop strings aside, are the texts
    Triton's postprocessing makes from each chunk and the tokens before it, keeping nothing between calls."""
    from trtpd.detokenize import text_delta

    ids = tok.encode("Streamed: naïve café — 日本語 🚀, then the decode server's 42 blocks.", add_bos=False)
    cuts = list(range(0, len(ids), step))
    stateless = [text_delta(tok, ids[:at], ids[at:at + step], is_final=False) for at in cuts]
    stateless.append(text_delta(tok, ids, [], is_final=True))
    assert stream(IncrementalDetokenizer(tok), ids, step) == stateless

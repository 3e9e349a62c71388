import pytest

from trtpd.engine import corpus
from trtpd.engine.tokenizer import BOS, BYTE_BASE, EOS, InvalidTextError, Tokenizer


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(corpus.training_corpus(), 1536)


def test_vocab_has_exactly_the_requested_size(tok):
    assert tok.vocab_size == 1536 == len(tok.tokens)


def test_training_is_deterministic(tok):
    again = Tokenizer.train(corpus.training_corpus(), 1536)
    assert again.tokens == tok.tokens and again.merges == tok.merges


def test_round_trip_and_merges_compress(tok):
    text = corpus.text(50, seed=99)
    ids = tok.encode(text)
    assert ids[0] == BOS
    assert tok.decode(ids) == text
    assert len(ids) < len(text) / 2   # learned merges, not one token per character


def test_characters_outside_the_alphabet_use_byte_fallback(tok):
    text = "KV 缓存 🚀 naïve"
    ids = tok.encode(text, add_bos=False)
    assert any(BYTE_BASE <= i < BYTE_BASE + 256 for i in ids)
    assert tok.decode(ids) == text


def test_invalid_utf8_bytes_are_refused(tok):
    with pytest.raises(InvalidTextError, match="not valid UTF-8"):
        tok.encode(b"abc\xff\xfe")


def test_special_and_reserved_tokens_decode_to_nothing(tok):
    reserved = [i for i, t in enumerate(tok.tokens) if t.startswith("<reserved")]
    assert tok.decode([BOS, EOS] + reserved[:3]) == ""


def test_save_and_load(tok, tmp_path):
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    loaded = Tokenizer.load(path)
    text = corpus.text(5, seed=3)
    assert loaded.encode(text) == tok.encode(text)


def test_out_of_range_token_id_is_an_error(tok):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])

"""The reference tokenizer: a Hugging Face tokenizers BPE in Llama-2's scheme, trained here."""

import json

import pytest

from trtpd.engine import corpus
from trtpd.engine.tokenizer import BOS, BYTE_BASE, EOS, InvalidTextError, Tokenizer


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(corpus.training_corpus(), 1536)


def test_vocab_has_exactly_the_requested_size(tok):
    assert tok.vocab_size == 1536


def test_llama_id_layout(tok):
    assert [tok.token_text(i) for i in (0, BOS, EOS)] == ["<unk>", "<s>", "</s>"]
    assert tok.token_text(BYTE_BASE) == "<0x00>" and tok.token_text(BYTE_BASE + 255) == "<0xFF>"
    assert tok.token_text(BYTE_BASE + 256) != "<0xFF>"


def test_training_is_deterministic(tok):
    again = Tokenizer.train(corpus.training_corpus(), 1536)
    assert again.tok.to_str() == tok.tok.to_str()


def test_round_trip_and_merges_compress(tok):
    text = corpus.text(50, seed=99)
    ids = tok.encode(text)
    assert ids[0] == BOS
    assert tok.decode(ids) == text
    assert len(ids) < len(text) / 2   # learned merges, not one token per character


@pytest.mark.parametrize("text", [" leading space", "two  spaces", "  x", "tabs\tand\nnewlines", "end "])
def test_spaces_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_pieces_carry_the_sentencepiece_space(tok):
    ids = tok.encode("the cache", add_bos=False)
    assert [tok.token_text(i) for i in ids] == ["\u2581the", "\u2581cache"]
    assert tok.decode(ids[1:]) == "cache"   # as Llama's: a piece decoded alone loses its leading space


def test_characters_outside_the_alphabet_use_byte_fallback(tok):
    text = "KV 缓存 🚀 naïve"
    ids = tok.encode(text, add_bos=False)
    assert any(BYTE_BASE <= i < BYTE_BASE + 256 for i in ids)
    assert tok.decode(ids) == text


def test_invalid_utf8_bytes_are_refused(tok):
    with pytest.raises(InvalidTextError, match="not valid UTF-8"):
        tok.encode(b"abc\xff\xfe")


def test_a_lone_surrogate_is_refused_as_invalid_text(tok):
    with pytest.raises(InvalidTextError):
        tok.encode("a\ud800b")
    with pytest.raises(InvalidTextError):
        tok.encode_off_thread("a\ud800b")


def test_special_and_reserved_tokens_decode_to_nothing():
    big = Tokenizer.train(corpus.training_corpus(), 4096)   # more than the corpus has merges for: padded
    reserved = [i for i in range(big.vocab_size) if (big.token_text(i) or "").startswith("<reserved")]
    assert big.vocab_size == 4096 and len(reserved) > 0
    assert big.decode([BOS, EOS] + reserved[:3]) == ""


def test_save_and_load_as_a_hugging_face_folder(tok, tmp_path):
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    assert json.loads(path.read_text())["model"]["type"] == "BPE"
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "</s>" and config["bos_token"] == "<s>"
    loaded = Tokenizer.load(path)
    text = corpus.text(5, seed=3)
    assert loaded.encode(text) == tok.encode(text) and (loaded.eos_id, loaded.bos_id) == (EOS, BOS)


def test_a_file_that_is_not_a_tokenizer_is_refused(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text('{"type": "trtpd-bpe", "version": 1}')
    with pytest.raises(ValueError, match="not a Hugging Face tokenizer.json"):
        Tokenizer.load(path)


def test_out_of_range_token_id_is_an_error(tok):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


def test_max_token_chars_bounds_the_token_count_from_the_text_length(tok):
    """A text of n characters has at least n / max_token_chars tokens (the gateway's refusal before tokenizing)."""
    for text in ["the " * 500, corpus.text(200, seed=5), "x" * 3000, "🚀" * 100]:
        assert len(tok.encode(text, add_bos=False)) >= len(text) / tok.max_token_chars


def test_a_hugging_face_config_names_eos_and_bos_in_either_form(tok, tmp_path):
    """transformers writes special tokens in tokenizer_config.json as a string or as an AddedToken dict
    ({"content": "</s>", ...}, as Llama-2's checkpoints do); both name the id the gateway stops at."""
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": {"__type": "AddedToken", "content": "<unk>", "special": True}, "bos_token": "</s>"}))
    loaded = Tokenizer.load(path)
    assert (loaded.eos_id, loaded.bos_id) == (0, EOS)

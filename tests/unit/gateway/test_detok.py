"""Streaming detokenization: chunks concatenate to the full text, no U+FFFD mid-character, stop strings cut."""

from trtpd.engine.tokenizer import BYTE_BASE
from trtpd.gateway.detok import IncrementalDetokenizer


def byte_ids(text: str) -> list[int]:
    return [BYTE_BASE + b for b in text.encode("utf-8")]


class ByteTokenizer:
    """Byte-level ids only: every multi-byte character spans several tokens."""

    def decode(self, ids):
        return bytes(i - BYTE_BASE for i in ids).decode("utf-8", errors="replace")


def stream(det, ids, step=1):
    chunks = [det.add(ids[i:i + step]) for i in range(0, len(ids), step)]
    return chunks + [det.finish()]


def test_a_character_split_across_tokens_never_shows_as_replacement():
    text = "naïve café — 日本語 ✓"
    chunks = stream(IncrementalDetokenizer(ByteTokenizer()), byte_ids(text))
    assert "".join(chunks) == text
    assert not any("\ufffd" in c for c in chunks)


def test_invalid_bytes_that_never_complete_are_flushed_at_the_end():
    ids = byte_ids("ok") + [BYTE_BASE + 0xE6, BYTE_BASE + 0x97]   # a truncated 3-byte character
    det = IncrementalDetokenizer(ByteTokenizer())
    chunks = stream(det, ids)
    assert "".join(chunks) == "ok\ufffd" and det.text == "ok\ufffd"


def test_a_stop_string_ends_the_text_before_it_even_across_chunks():
    det = IncrementalDetokenizer(ByteTokenizer(), stop=["END", "\n\n"])
    chunks = stream(det, byte_ids("abc EN") + byte_ids("D more"), step=2)
    assert "".join(chunks) == "abc " and det.stopped
    assert "E" not in "".join(chunks[:-1])   # the partial stop string was held back, never streamed


def test_a_held_back_prefix_that_does_not_become_a_stop_string_is_released():
    det = IncrementalDetokenizer(ByteTokenizer(), stop=["ENDING"])
    assert "".join(stream(det, byte_ids("the END of it"))) == "the END of it" and not det.stopped

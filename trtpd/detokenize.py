"""Streaming detokenization: the one rule for the text a streamed chunk of tokens adds.

    text_delta(prefix, new) = decode(prefix + new) minus decode(prefix), each cut before a trailing U+FFFD run

A SentencePiece piece decoded alone loses its leading space (Llama's decoder strips one: `decode([id of
"▁the"])` is "the"), so a chunk is decoded after the tokens before it and only the difference is its text. A
character whose bytes span tokens decodes as U+FFFD until its last byte arrives, so the text is cut before a
trailing U+FFFD run and that run is released with the chunk that completes it, or at the end (`is_final`: bytes
that never formed a character show as U+FFFD, as the whole decode shows them). The rule is stateless, a
function of the two token lists: every chunk's text is stable(decode(all up to it)) minus stable(decode(all
before it)), so the chunks of a stream concatenate to decode(all), however the tokens were split into chunks.

It needs the whole prefix (the completion's tokens before the chunk) but decodes only its tail: the last
CONTEXT_TOKENS, doubled until that tail has stable text of its own or is the whole prefix. A tail with text
decodes, from its first complete character on, exactly as the whole prefix does there (UTF-8 resynchronises at
the next character; the one stripped leading space falls inside the tail's own text), and it holds every byte
of a character still incomplete at its end (those bytes alone decode to U+FFFD only). So the work per chunk is
a few tokens, and the result is exact for decoders that only append to the text of earlier tokens (Llama's,
Metaspace, byte-level BPE); only a long run of tokens without text (special tokens) widens the tail.

Two faces share it: the gateway's IncrementalDetokenizer (one process sees the whole stream) and Triton's
`postprocessing` model, which the ensemble calls once per streamed response and which keeps no state between
calls: the entry model sends each chunk's prefix with it (`prefix_ids`, `is_final`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT = "\ufffd"
CONTEXT_TOKENS = 8      # the prefix tail decoded first (vLLM's incremental detokenizer starts from 5)


class Decoder(Protocol):
    def decode(self, ids: list[int]) -> str:
        """The text of `ids` (special tokens skipped), as the whole completion's text is made."""


def text_delta(tokenizer: Decoder, prefix_ids: Sequence[int], new_ids: Sequence[int], *, is_final: bool) -> str:
    """The text `new_ids` add to a completion whose earlier tokens are `prefix_ids` ("" while it is held back).
    With is_final, whatever is still held back comes out too (new_ids may then be empty)."""
    start, before = _context(tokenizer, prefix_ids)
    text = tokenizer.decode([*prefix_ids[start:], *new_ids])
    upto = text if is_final else stable(text)
    return upto[len(before):] if len(upto) > len(before) else ""


def stable(text: str) -> str:
    """The text that no later token can change: all of it but a trailing U+FFFD run (bytes that may still
    become a character)."""
    return text.rstrip(REPLACEMENT)


def _context(tokenizer: Decoder, prefix_ids: Sequence[int]) -> tuple[int, str]:
    """Where the decoded tail of the prefix starts, and its stable text."""
    num_tokens = len(prefix_ids)
    span = CONTEXT_TOKENS
    while True:
        start = max(0, num_tokens - span)
        before = stable(tokenizer.decode(list(prefix_ids[start:])))
        if before or start == 0:
            return start, before
        span *= 2

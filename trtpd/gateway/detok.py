"""Incremental detokenization for streaming: each chunk is the new *stable* text.

Text comes from trtpd/detokenize.py's rule, the one Triton's postprocessing model applies too: each step's
tokens are decoded after the tokens before them, so a SentencePiece piece keeps its leading space ("▁the" after
"Hello" streams " the", where decoding it alone gives "the"), and a character split across byte-fallback tokens
is held until its last byte arrives. A tail that could still grow into a stop string is held back too (OpenAI
semantics: the stop string ends the text and is not part of it). At the end the rest is flushed (bytes that
never formed a character as U+FFFD, as the whole decode shows them), so the streamed chunks always concatenate
to the full completion's text.
"""

from __future__ import annotations

from collections.abc import Sequence

from trtpd.detokenize import text_delta


class IncrementalDetokenizer:
    def __init__(self, tokenizer, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []   # the completion's tokens so far
        self.stop = [s for s in stop if s]
        self.decoded = ""            # text decoded so far (stable characters only)
        self.emitted = ""            # text sent so far
        self.stopped = False         # a stop string was reached: the text ends before it

    def add(self, token_ids: Sequence[int]) -> str:
        """The text that became stable with these tokens ("" when it is held back)."""
        if self.stopped:
            return ""
        self.decoded += text_delta(self.tokenizer, self.token_ids, token_ids, is_final=False)
        self.token_ids += token_ids
        return self._release(self.decoded, final=False)

    def finish(self) -> str:
        """Whatever is still held back, at the end of the completion."""
        if self.stopped:
            return ""
        # bytes of a character that never completed come out as U+FFFD, as the whole decode shows them
        self.decoded += text_delta(self.tokenizer, self.token_ids, [], is_final=True)
        return self._release(self.decoded, final=True)

    @property
    def text(self) -> str:
        return self.emitted

    def _release(self, text: str, final: bool) -> str:
        cut = self._stop_at(text)
        if cut is not None:
            self.stopped = True
            return self._emit(text[:cut])
        return self._emit(text if final else text[:len(text) - self._stop_prefix_len(text)])

    def _emit(self, upto: str) -> str:
        if len(upto) <= len(self.emitted):
            return ""
        new = upto[len(self.emitted):]
        self.emitted = upto
        return new

    def _stop_at(self, text: str) -> int | None:
        """Where the first stop string starts in the text not yet emitted (searched from the emitted end's
        reach back, so a stop string spanning two chunks is found)."""
        start = max(0, len(self.emitted) - max((len(s) for s in self.stop), default=0))
        hits = [i for s in self.stop if (i := text.find(s, start)) >= 0]
        return min(hits) if hits else None

    def _stop_prefix_len(self, text: str) -> int:
        """The longest tail of `text` that is a proper prefix of some stop string (it might become one)."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    best = max(best, n)
                    break
        return best

"""A byte-fallback BPE tokenizer that needs no download (Llama's scheme, trained here).

Ids: 0 <unk>, 1 <s> (BOS), 2 </s> (EOS), 3..258 the byte tokens <0x00>..<0xFF> (for characters
outside the learned alphabet, as SentencePiece's byte fallback), then the base characters, then
merges, then reserved tokens that pad the vocabulary to the model's size (they decode to "").
Training is deterministic: pair counts break ties by the pair itself.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from functools import lru_cache
from pathlib import Path

UNK, BOS, EOS = 0, 1, 2
NUM_SPECIAL = 3
BYTE_BASE = NUM_SPECIAL
NUM_BYTES = 256
_PIECE = re.compile(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+")


class InvalidTextError(ValueError):
    """The input is not valid UTF-8 text."""


def pieces(text: str) -> list[str]:
    return _PIECE.findall(text)


class Tokenizer:
    def __init__(self, tokens: list[str], merges: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.merges = merges
        self.vocab_size = len(tokens)
        self.ids = {t: i for i, t in enumerate(tokens) if i >= BYTE_BASE + NUM_BYTES and not t.startswith("<reserved")}
        self.merge_rank = {pair: rank for rank, pair in enumerate(merges)}
        self._encode_piece = lru_cache(maxsize=65536)(self._encode_piece_uncached)

    # ---- training -------------------------------------------------------------------------
    @classmethod
    def train(cls, corpus: str, vocab_size: int) -> "Tokenizer":
        alphabet = sorted(set(corpus))
        tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(NUM_BYTES)] + alphabet
        if len(tokens) > vocab_size:
            raise ValueError(f"vocab_size {vocab_size} is smaller than the base vocabulary ({len(tokens)})")
        words = Counter(pieces(corpus))
        splits = {w: list(w) for w in words}
        merges: list[tuple[str, str]] = []
        known = set(tokens)
        while len(tokens) < vocab_size:
            pairs: Counter = Counter()
            for w, n in words.items():
                s = splits[w]
                for a, b in zip(s, s[1:]):
                    pairs[(a, b)] += n
            if not pairs:
                break
            best = min(pairs, key=lambda p: (-pairs[p], p))
            if pairs[best] < 2:
                break
            merged = best[0] + best[1]
            merges.append(best)
            if merged not in known:
                tokens.append(merged)
                known.add(merged)
            for w in words:
                s = splits[w]
                i, out = 0, []
                while i < len(s):
                    if i + 1 < len(s) and s[i] == best[0] and s[i + 1] == best[1]:
                        out.append(merged)
                        i += 2
                    else:
                        out.append(s[i])
                        i += 1
                splits[w] = out
        tokens += [f"<reserved_{i}>" for i in range(vocab_size - len(tokens))]
        return cls(tokens, merges)

    # ---- persistence ----------------------------------------------------------------------
    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"type": "trtpd-bpe", "version": 1, "tokens": self.tokens,
                                    "merges": [list(m) for m in self.merges]}, ensure_ascii=False))

    @classmethod
    def load(cls, path: Path) -> "Tokenizer":
        data = json.loads(Path(path).read_text())
        if data.get("type") != "trtpd-bpe":
            raise ValueError(f"{path}: not a trtpd tokenizer file")
        return cls(data["tokens"], [tuple(m) for m in data["merges"]])

    # ---- encode / decode ------------------------------------------------------------------
    def _encode_piece_uncached(self, piece: str) -> tuple[int, ...]:
        parts = list(piece)
        while len(parts) > 1:
            ranked = [(self.merge_rank.get((a, b), None), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            ranked = [(r, i) for r, i in ranked if r is not None]
            if not ranked:
                break
            _, i = min(ranked)
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        ids: list[int] = []
        for part in parts:
            if part in self.ids:
                ids.append(self.ids[part])
            else:
                ids.extend(BYTE_BASE + b for b in part.encode("utf-8"))
        return tuple(ids)

    def encode(self, text: "str | bytes", add_bos: bool = True) -> list[int]:
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidTextError(f"input is not valid UTF-8 (byte {exc.start}: {exc.reason})") from None
        ids = [BOS] if add_bos else []
        for piece in pieces(text):
            ids.extend(self._encode_piece(piece))
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary (0..{self.vocab_size - 1})")
        if token_id < NUM_SPECIAL:
            return b""
        if token_id < BYTE_BASE + NUM_BYTES:
            return bytes([token_id - BYTE_BASE])
        token = self.tokens[token_id]
        return b"" if token.startswith("<reserved") else token.encode("utf-8")

    def decode(self, ids: list[int]) -> str:
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")

"""The text tokenizer for pre/post-processing: trtpd's reference tokenizer, or a Hugging Face one
(the GPU path, where transformers is installed in the serving container)."""

from __future__ import annotations

import json
from pathlib import Path

from trtpd.engine.tokenizer import Tokenizer


class HfTokenizer:
    def __init__(self, path: Path) -> None:
        from transformers import AutoTokenizer   # only in the GPU serving container
        self.tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.eos_id = self.tok.eos_token_id
        self.vocab_size = len(self.tok)

    def encode(self, text: "str | bytes", add_bos: bool = True) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return self.tok.encode(text, add_special_tokens=add_bos)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


def load_text_tokenizer(path: "str | Path"):
    path = Path(path)
    tok_file = path / "tokenizer.json"
    if tok_file.is_file() and json.loads(tok_file.read_text()).get("type") == "trtpd-bpe":
        return Tokenizer.load(tok_file)
    return HfTokenizer(path)

"""The text tokenizer for pre/post-processing and the gateway: the tokenizer.json in a checkpoint folder,
read with Hugging Face's `tokenizers` (trtpd's reference tokenizer is one; so is every Llama, Mistral and
Qwen checkpoint on the hub). No transformers and no download: a folder without tokenizer.json is refused."""

from __future__ import annotations

from pathlib import Path

from trtpd.engine.tokenizer import Tokenizer
from trtpd.errors import ConfigError

TOKENIZER_FILE = "tokenizer.json"


def load_text_tokenizer(path: "str | Path") -> Tokenizer:
    tok_file = Path(path) / TOKENIZER_FILE
    if not tok_file.is_file():
        raise ConfigError(f"{path}: no {TOKENIZER_FILE}; point tokenizer_dir at a checkpoint folder that has one "
                          f"(every Hugging Face Llama checkpoint does; `trtpd build` writes it for the reference "
                          f"backend)")
    try:
        return Tokenizer.load(tok_file)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None

"""The reference tokenizer as a Hugging Face `tokenizers` folder, for client tools that count tokens with
`transformers.AutoTokenizer` (NVIDIA aiperf's `--tokenizer PATH`): no download, the same ids.

trtpd's tokenizer (trtpd/engine/tokenizer.py) is Llama's scheme: BPE over pieces split by one regex, byte
fallback for characters outside the learned alphabet, <s> prepended. That maps one to one onto a
tokenizer.json: a Split pre-tokenizer with the same regex, a BPE model with byte_fallback and the merges in
rank order, a TemplateProcessing post-processor adding <s>, and ByteFallback + Fuse decoders.
Only the standard library is used to write it.

    python -m trtpd.bench.hf_tokenizer engines/tiny-llama/reference-fp16/checkpoint out/hf-tokenizer
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trtpd.engine.tokenizer import _PIECE, BOS, EOS, UNK, Tokenizer

TOKENIZER_FILE = "tokenizer.json"


def tokenizer_json(tok: Tokenizer) -> dict:
    special = {UNK: tok.tokens[UNK], BOS: tok.tokens[BOS], EOS: tok.tokens[EOS]}
    vocab: dict[str, int] = {}
    for i, t in enumerate(tok.tokens):
        vocab.setdefault(t, i)
    bos = special[BOS]
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in special.items()],
        "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": _PIECE.pattern}, "behavior": "Isolated",
                          "invert": False},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [BOS], "tokens": [bos]}}},
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": special[UNK], "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for a, b in tok.merges]},
    }


def export(checkpoint_dir: Path, out_dir: Path) -> Path:
    """Writes tokenizer.json and tokenizer_config.json for the checkpoint's tokenizer into out_dir."""
    from trtpd.engine.checkpoint import TOKENIZER_FILE as SOURCE

    tok = Tokenizer.load(Path(checkpoint_dir) / SOURCE)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / TOKENIZER_FILE).write_text(json.dumps(tokenizer_json(tok), ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": tok.tokens[BOS], "eos_token": tok.tokens[EOS],
        "unk_token": tok.tokens[UNK], "add_bos_token": True, "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 20}, indent=1))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m trtpd.bench.hf_tokenizer CHECKPOINT_DIR OUT_DIR", file=sys.stderr)
        return 2
    print(export(Path(argv[0]), Path(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The reference tokenizer: a Hugging Face `tokenizers` model in Llama-2's scheme, trained here, no download.

Llama-2's own tokenizer.json (a SentencePiece BPE converted by transformers) is what it copies: pieces carry
"▁" for a space (a Metaspace pre-tokenizer, "▁" prepended to the text), byte fallback for characters outside
the learned alphabet (tokens <0x00>..<0xFF>), <s> prepended by the post-processor, and the decoder
Replace("▁", " ") + ByteFallback + Fuse + Strip(one leading space). So `decode([id of "▁the"])` is "the",
without its space, exactly as Llama's is: streamed text must be detokenized incrementally (trtpd/detokenize.py).

Ids: 0 <unk>, 1 <s> (BOS), 2 </s> (EOS), 3..258 the byte tokens, then the learned pieces in the order BPE
training added them, then reserved special tokens that pad the vocabulary to the model's size (they decode
to "", as Llama-3's reserved tokens do). The file is a plain tokenizer.json with a tokenizer_config.json
beside it, so transformers' AutoTokenizer, aiperf's --tokenizer and the GPU path's tooling read the
checkpoint folder as it is. Training is deterministic (the same corpus gives the same file, byte for byte).
Encoding is linear in the text's length (the `tokenizers` library's BPE), unlike the hand-written BPE it
replaces, which was quadratic in the length of a word.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HfTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

UNK, BOS, EOS = 0, 1, 2
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
NUM_SPECIAL = 3
BYTE_BASE = NUM_SPECIAL
NUM_BYTES = 256
SPACE = "\u2581"   # "▁", SentencePiece's visible space
CONFIG_FILE = "tokenizer_config.json"


class InvalidTextError(ValueError):
    """The input is not text the tokenizer can take (invalid UTF-8, a lone surrogate)."""


def _pipeline(model) -> HfTokenizer:
    tok = HfTokenizer(model)
    # Llama-2's tokenizer.json normalizer (SentencePiece's dummy prefix, spaces made visible), then pieces split
    # before each "▁" so that BPE works word by word
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="never", split=True)
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return tok


class Tokenizer:
    """Any `tokenizers` tokenizer.json (the reference one, or a Hugging Face checkpoint's) behind the few calls
    trtpd makes: encode with or without BOS, decode without special tokens, incremental decoding."""

    def __init__(self, tok: HfTokenizer, eos_id: int = EOS, bos_id: int | None = BOS) -> None:
        self.tok = tok
        self.eos_id = eos_id
        self.bos_id = bos_id
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        # the most characters one token can stand for (added tokens too: "<s>" in a prompt is one token): a
        # prompt longer than max_input_len times this has more than max_input_len tokens, whatever its text, so
        # it is refused before it is tokenized. (Exact for normalizers that only add characters, as Llama's and
        # byte-level BPE's do; one that composes characters, NFC, could shorten a text below this bound.)
        self.max_token_chars = max((len(p) for p in tok.get_vocab(with_added_tokens=True)), default=1)
        self.piece_bytes = _piece_bytes(tok)

    # ---- training -------------------------------------------------------------------------
    @classmethod
    def train(cls, corpus: str, vocab_size: int) -> "Tokenizer":
        alphabet = sorted(set(corpus.replace(" ", SPACE)) | {SPACE})
        base = NUM_SPECIAL + NUM_BYTES + len(alphabet)
        if base > vocab_size:
            raise ValueError(f"vocab_size {vocab_size} is smaller than the base vocabulary ({base})")
        draft = _pipeline(models.BPE(unk_token=SPECIAL_TOKENS[UNK], byte_fallback=True))
        trainer = trainers.BpeTrainer(vocab_size=vocab_size - NUM_BYTES, special_tokens=list(SPECIAL_TOKENS),
                                      initial_alphabet=alphabet, limit_alphabet=len(alphabet), min_frequency=2,
                                      show_progress=False)
        draft.train_from_iterator([corpus], trainer=trainer)
        learned = json.loads(draft.to_str())["model"]
        # Llama's id order: the specials, the 256 byte tokens, then the learned pieces
        vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
        vocab.update({f"<0x{b:02X}>": BYTE_BASE + b for b in range(NUM_BYTES)})
        for piece, i in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
            if piece not in vocab:
                vocab[piece] = len(vocab)
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in learned["merges"]]
        tok = _pipeline(models.BPE(vocab=vocab, merges=merges, unk_token=SPECIAL_TOKENS[UNK], byte_fallback=True))
        tok.add_special_tokens([*SPECIAL_TOKENS, *(f"<reserved_{i}>" for i in range(vocab_size - len(vocab)))])
        tok.post_processor = processors.TemplateProcessing(
            single=f"{SPECIAL_TOKENS[BOS]} $A", pair=f"{SPECIAL_TOKENS[BOS]} $A {SPECIAL_TOKENS[BOS]} $B",
            special_tokens=[(SPECIAL_TOKENS[BOS], BOS)])
        return cls(tok)

    # ---- persistence ----------------------------------------------------------------------
    def save(self, path: Path) -> None:
        """Writes tokenizer.json at `path` and tokenizer_config.json beside it (what AutoTokenizer reads)."""
        path = Path(path)
        path.write_text(self.tok.to_str(pretty=False))
        vocab = self.tok.get_vocab(with_added_tokens=True)
        names = {i: t for t, i in vocab.items()}
        (path.parent / CONFIG_FILE).write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": names.get(self.bos_id),
            "eos_token": names.get(self.eos_id), "unk_token": names.get(UNK), "add_bos_token": True,
            "add_eos_token": False, "clean_up_tokenization_spaces": False, "legacy": False,
            "model_max_length": 1 << 20}, indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> "Tokenizer":
        """A tokenizer.json; the EOS and BOS ids come from the tokenizer_config.json beside it when it names them
        (a Hugging Face checkpoint), else Llama's 2 and 1."""
        path = Path(path)
        try:
            tok = HfTokenizer.from_file(str(path))
        except Exception as exc:   # noqa: BLE001 - the library raises plain Exception for a bad file
            raise ValueError(f"{path}: not a Hugging Face tokenizer.json ({exc})") from None
        config_path = path.parent / CONFIG_FILE
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        eos, bos = _token_id(tok, config.get("eos_token")), _token_id(tok, config.get("bos_token"))
        return cls(tok, EOS if eos is None else eos, BOS if bos is None and "bos_token" not in config else bos)

    # ---- encode / decode ------------------------------------------------------------------
    def encode(self, text: "str | bytes", add_bos: bool = True) -> list[int]:
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidTextError(f"input is not valid UTF-8 (byte {exc.start}: {exc.reason})") from None
        try:
            return self.tok.encode(text, add_special_tokens=add_bos).ids
        except (TypeError, ValueError, UnicodeError) as exc:   # a lone surrogate cannot cross into Rust
            raise InvalidTextError(f"input is not valid Unicode text ({exc})") from None

    def encode_off_thread(self, text: str, add_bos: bool = True) -> list[int]:
        """encode, through the library's batch call, which releases the GIL while it works (for a worker thread:
        the event loop's thread keeps running meanwhile)."""
        try:
            return self.tok.encode_batch([text], add_special_tokens=add_bos)[0].ids
        except (TypeError, ValueError, UnicodeError) as exc:
            raise InvalidTextError(f"input is not valid Unicode text ({exc})") from None

    def decode(self, ids: list[int]) -> str:
        """The text of `ids` without special tokens. In Llama's scheme, byte by byte (as SentencePiece decodes:
        the pieces' bytes joined, then UTF-8 with U+FFFD for what never forms a character), which streaming
        reproduces exactly; the library's decoder instead replaces a whole run of byte tokens when any of it is
        invalid, so a prefix of the tokens could decode to text that is not a prefix of the whole."""
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary (0..{self.vocab_size - 1})")
        if self.piece_bytes is None:
            return self.tok.decode(ids, skip_special_tokens=True)
        text = b"".join(self.piece_bytes[i] for i in ids).decode("utf-8", "replace")
        return text[1:] if text.startswith(" ") else text

    def token_text(self, token_id: int) -> str | None:
        return self.tok.id_to_token(token_id)


def _piece_bytes(tok: HfTokenizer) -> list[bytes] | None:
    """Each token's bytes, for a tokenizer whose decoder is Llama's (Replace "▁" by " ", ByteFallback, Fuse, Strip
    one leading space) or a Metaspace one with byte fallback; special tokens give b"". None for any other decoder."""
    decoder = json.loads(tok.to_str()).get("decoder") or {}
    parts = decoder.get("decoders", [decoder])
    kinds = [d.get("type") for d in parts]
    spaced = any(d.get("type") == "Replace" and d.get("pattern", {}).get("String") == SPACE and d.get("content") == " "
                 for d in parts) or "Metaspace" in kinds
    if "ByteFallback" not in kinds or not spaced or not set(kinds) <= {"Replace", "ByteFallback", "Fuse", "Strip",
                                                                          "Metaspace"}:
        return None
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    table = []
    for i in range(tok.get_vocab_size(with_added_tokens=True)):
        piece = tok.id_to_token(i) or ""
        if piece in special:
            table.append(b"")
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            table.append(bytes([int(piece[3:5], 16)]))
        else:
            table.append(piece.replace(SPACE, " ").encode("utf-8"))
    return table


def _token_id(tok: HfTokenizer, token) -> int | None:
    if isinstance(token, dict):   # transformers' AddedToken form
        token = token.get("content")
    return tok.token_to_id(token) if isinstance(token, str) else None

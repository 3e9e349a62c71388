"""context_phase_params: the opaque, signed handle that tells a decode instance where a request's KV is.

TensorRT-LLM's Triton model returns `context_phase_params` (UINT8[-1]) from a `context_only` request and
takes it back on the `generation_only` request. trtpd's handle carries the exporter's endpoint, the
request id, the KV layout, the token count, the first token (None while prefill is still running, for
layer-wise pipelining) and a validity window, signed with HMAC-SHA256 under a key the deployment generates.

Blob: MAGIC (4 bytes, b"TPDH") | HMAC-SHA256(key, MAGIC | payload) (32 bytes) | payload (compact JSON, sorted keys).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from trtpd.errors import ConfigError
from trtpd.kv.errors import (KvHandleExpiredError, KvHandleForgedError, KvHandleMalformedError,
                             KvLayoutMismatchError)
from trtpd.kv.layout import KvLayout

HANDLE_VERSION = 1
MAGIC = b"TPDH"
TAG_BYTES = 32
MIN_KEY_BYTES = 16
MAX_HANDLE_BYTES = 64 * 1024
KEY_FIX = "give prefill and decode the same key file (load_or_create_key_file on the shared path)"


@dataclass(frozen=True)
class ContextPhaseParams:
    version: int
    endpoint: str          # transport address of the prefill-side exporter, e.g. tcp://10.0.0.5:41000
    request_id: str        # unique per export
    layout: KvLayout       # the prefill side's KV layout
    num_tokens: int
    first_token: int | None   # None: issued before prefill finished (pull layer by layer as layers are ready)
    issued_at_s: float     # wall clock (time.time()), since handles cross hosts
    expires_at_s: float

    def to_dict(self) -> dict:
        return {"version": self.version, "endpoint": self.endpoint, "request_id": self.request_id,
                "layout": self.layout.to_dict(), "num_tokens": self.num_tokens, "first_token": self.first_token,
                "issued_at_s": self.issued_at_s, "expires_at_s": self.expires_at_s}

    @classmethod
    def from_dict(cls, d: dict) -> "ContextPhaseParams":
        first_token = d["first_token"]
        return cls(int(d["version"]), str(d["endpoint"]), str(d["request_id"]), KvLayout.from_dict(d["layout"]),
                   int(d["num_tokens"]), None if first_token is None else int(first_token),
                   float(d["issued_at_s"]), float(d["expires_at_s"]))


def generate_key() -> bytes:
    return secrets.token_bytes(32)


def encode(params: ContextPhaseParams, key: bytes) -> bytes:
    check_key(key)
    payload = json.dumps(params.to_dict(), sort_keys=True, separators=(",", ":")).encode()
    return MAGIC + _tag(key, payload) + payload


def decode(blob: bytes, key: bytes, now_s: float) -> ContextPhaseParams:
    """Verifies the signature and the validity window; raises a KvHandleError subclass if it cannot be trusted."""
    check_key(key)
    blob = bytes(blob)
    if len(blob) <= len(MAGIC) + TAG_BYTES or len(blob) > MAX_HANDLE_BYTES or not blob.startswith(MAGIC):
        raise KvHandleMalformedError(
            f"context_phase_params ({len(blob)} bytes) is not a trtpd KV handle: it must start with {MAGIC!r} and "
            f"carry a signature and a payload; pass the context_phase_params output of the prefill model unchanged")
    tag, payload = blob[len(MAGIC):len(MAGIC) + TAG_BYTES], blob[len(MAGIC) + TAG_BYTES:]
    if not hmac.compare_digest(tag, _tag(key, payload)):
        raise KvHandleForgedError(
            "context_phase_params signature does not verify: the handle was altered, or prefill and decode use "
            f"different KV keys; {KEY_FIX}")
    try:
        params = ContextPhaseParams.from_dict(json.loads(payload))
    except (ValueError, KeyError, TypeError, ConfigError) as e:
        raise KvHandleMalformedError(f"context_phase_params payload is signed but unreadable ({e}); "
                                     f"prefill and decode run different trtpd versions, upgrade both") from None
    if params.version != HANDLE_VERSION:
        raise KvHandleMalformedError(
            f"context_phase_params version {params.version} is not supported (this decode side reads version "
            f"{HANDLE_VERSION}); run the same trtpd version on prefill and decode")
    if now_s > params.expires_at_s:
        raise KvHandleExpiredError(
            f"context_phase_params for request {params.request_id!r} expired {now_s - params.expires_at_s:.3f} s ago "
            f"(valid {params.expires_at_s - params.issued_at_s:.1f} s from issue); the prefill side has freed or "
            f"will free its KV: re-run prefill, or raise transfer_timeout_s if decode is routinely this late")
    return params


def check_layout(params: ContextPhaseParams, local_layout: KvLayout) -> None:
    """Raises KvLayoutMismatchError naming every difference between the handle's (prefill) and the local layout."""
    problems = params.layout.mismatches(local_layout, "prefill", "decode")
    if problems:
        raise KvLayoutMismatchError(
            f"KV layout of request {params.request_id!r} from {params.endpoint} does not match this decode "
            f"instance, nothing was pulled:\n  " + "\n  ".join(problems), problems)


def load_or_create_key_file(path: str | os.PathLike) -> bytes:
    """Reads the deployment's KV key (hex text, mode 0600), creating it with a fresh key if it does not exist."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process created it first; read theirs
        else:
            with os.fdopen(fd, "w") as f:
                f.write(generate_key().hex() + "\n")
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise ConfigError(f"KV key file {path} is readable by others (mode {mode:04o}); run: chmod 600 {path}")
    text = path.read_text().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"KV key file {path} does not hold a hex key of at least {MIN_KEY_BYTES} bytes; delete it "
                          f"so trtpd generates a new one, and give prefill and decode the same file")
    return key


def _tag(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, MAGIC + payload, hashlib.sha256).digest()


def check_key(key: bytes) -> None:
    if not isinstance(key, (bytes, bytearray)) or len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"KV handle key must be at least {MIN_KEY_BYTES} bytes (use generate_key() or "
                          f"load_or_create_key_file())")

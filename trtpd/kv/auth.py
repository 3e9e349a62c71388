"""Proofs that a peer holds the deployment's KV key: for KV pulls, and for requests to the role models.

Both are HMAC-SHA256 under keys derived from the deployment's KV key (handle.py load_or_create_key_file,
mode 0600), one derived key per purpose and direction, so a value made for one purpose never verifies
for another (no reflection of the exporter's own proof back at it).

KV pull (frame.py has the wire format). A signed handle is a bearer token that travels through Triton
(a python-backend shared-memory region, a response to the orchestrator), so holding one must not be
enough to read a request's KV. On every connection:
    exporter -> importer  HELLO  payload: exporter nonce (32 random bytes)
    importer -> exporter  PULL   payload: proof (32) | importer nonce (32) | handle
        proof = HMAC(derive(key, "kv-pull/importer"), exporter nonce | importer nonce | SHA-256(handle))
    exporter              checks the proof with hmac.compare_digest before it reads the handle
    exporter -> importer  ACCEPT payload: exporter proof (32) | the transport's ACCEPT payload
        exporter proof = HMAC(derive(key, "kv-pull/exporter"), exporter nonce | importer nonce | SHA-256(handle))
The exporter's nonce is fresh per connection, so a proof captured on one connection is refused on any
other (no replay); the importer's nonce makes the exporter's answer fresh too, so the importer knows it
talks to this deployment's exporter and not to whatever listens on that port now.

Role-model requests. The orchestrator (disagg_bls) adds the request parameter `trtpd_auth`
    v1:<issued_at_s>:<hex HMAC(derive(key, "orchestrator"), "v1" | request_type | issued_at_s | SHA-256(input_ids))>
and prefill/decode/colocated refuse requests without a valid, fresh one. A client of the public
ensemble endpoint never sees it (it exists only between the BLS and the role models, inside Triton's
python-backend shared memory, which is 0600 to the server's uid), and a captured token is good only for
the same request type and prompt, for ORCHESTRATOR_TOKEN_MAX_AGE_S.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import numpy as np

from trtpd.errors import TrtpdError
from trtpd.kv.errors import KvTransferError
from trtpd.kv.handle import check_key

NONCE_BYTES = 32
PROOF_BYTES = 32
AUTH_PARAMETER = "trtpd_auth"
TOKEN_VERSION = "v1"
ORCHESTRATOR_TOKEN_MAX_AGE_S = 120.0    # also the clock skew tolerated between the BLS and a role model


class KvPeerAuthError(KvTransferError):
    """The other end of a KV pull did not prove it holds the deployment's KV key."""


class OrchestratorAuthError(TrtpdError, ValueError):
    """A role-model request did not carry a valid proof that the deployment's orchestrator sent it.
    The caller's fault: INVALID_ARG (Triton has no PERMISSION_DENIED code; the message says permission denied)."""

    kind = "invalid_arg"


def derive_key(key: bytes, purpose: str) -> bytes:
    check_key(key)
    return hmac.new(key, b"trtpd/" + purpose.encode(), hashlib.sha256).digest()


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


# ---- KV pulls -------------------------------------------------------------------------------------

def _pull_mac(key: bytes, side: str, exporter_nonce: bytes, importer_nonce: bytes, handle: bytes) -> bytes:
    if len(exporter_nonce) != NONCE_BYTES or len(importer_nonce) != NONCE_BYTES:
        raise ValueError(f"KV pull nonces must be {NONCE_BYTES} bytes")
    message = exporter_nonce + importer_nonce + hashlib.sha256(handle).digest()
    return hmac.new(derive_key(key, f"kv-pull/{side}"), message, hashlib.sha256).digest()


def importer_proof(key: bytes, exporter_nonce: bytes, importer_nonce: bytes, handle: bytes) -> bytes:
    return _pull_mac(key, "importer", exporter_nonce, importer_nonce, handle)


def exporter_proof(key: bytes, exporter_nonce: bytes, importer_nonce: bytes, handle: bytes) -> bytes:
    return _pull_mac(key, "exporter", exporter_nonce, importer_nonce, handle)


def pack_pull(key: bytes, exporter_nonce: bytes, handle: bytes) -> tuple[bytes, bytes]:
    """The PULL payload answering this exporter nonce, and the importer nonce it carries."""
    importer_nonce = new_nonce()
    return importer_proof(key, exporter_nonce, importer_nonce, handle) + importer_nonce + handle, importer_nonce


def pack_release(key: bytes, exporter_nonce: bytes, handle: bytes) -> bytes:
    """The RELEASE payload (frame.py): as a PULL's, with a proof of its own, so neither stands for the other."""
    importer_nonce = new_nonce()
    return _pull_mac(key, "release", exporter_nonce, importer_nonce, handle) + importer_nonce + handle


def unpack_release(key: bytes, exporter_nonce: bytes, payload: bytes) -> bytes:
    """Checks a RELEASE payload's proof; returns the handle. Raises KvPeerAuthError."""
    return _unpack(key, exporter_nonce, payload, "release")[1]


def unpack_pull(key: bytes, exporter_nonce: bytes, payload: bytes) -> tuple[bytes, bytes]:
    """Checks a PULL payload's proof; returns (importer nonce, handle). Raises KvPeerAuthError."""
    return _unpack(key, exporter_nonce, payload, "importer")


def _unpack(key: bytes, exporter_nonce: bytes, payload: bytes, side: str) -> tuple[bytes, bytes]:
    what = "PULL" if side == "importer" else "RELEASE"
    if len(payload) < PROOF_BYTES + NONCE_BYTES:
        raise KvPeerAuthError(f"the {what} carries {len(payload)} bytes, too few for the key proof "
                              f"({PROOF_BYTES} bytes) and nonce ({NONCE_BYTES} bytes) that every pull must send")
    proof = payload[:PROOF_BYTES]
    importer_nonce = payload[PROOF_BYTES:PROOF_BYTES + NONCE_BYTES]
    handle = payload[PROOF_BYTES + NONCE_BYTES:]
    if not hmac.compare_digest(proof, _pull_mac(key, side, exporter_nonce, importer_nonce, handle)):
        raise KvPeerAuthError(
            "the puller did not prove it holds the deployment's KV key (its HMAC over this connection's "
            "challenge does not verify); a handle alone does not give access to KV. A decode instance of this "
            "deployment must use the same key file as prefill")
    return importer_nonce, handle


def check_exporter_proof(key: bytes, exporter_nonce: bytes, importer_nonce: bytes, handle: bytes,
                         proof: bytes, where: str) -> None:
    if not hmac.compare_digest(proof, exporter_proof(key, exporter_nonce, importer_nonce, handle)):
        raise KvPeerAuthError(
            f"{where}: the endpoint did not prove it holds the deployment's KV key, so it is not this "
            f"deployment's prefill exporter (another process may listen on that port now); nothing was read "
            f"from it; re-run prefill for this request")


# ---- orchestrator tokens ---------------------------------------------------------------------------

def _digest_ids(input_ids) -> bytes:
    if input_ids is None:
        return hashlib.sha256(b"").digest()
    try:
        ids = np.ascontiguousarray(np.asarray(input_ids).reshape(-1), dtype="<i8")
    except (TypeError, ValueError):
        raise OrchestratorAuthError("permission denied: input_ids are not integers, so the request's "
                                    f"{AUTH_PARAMETER} cannot be checked") from None
    return hashlib.sha256(ids.tobytes()).digest()


def _token_mac(key: bytes, request_type: str, issued: str, input_ids) -> str:
    message = b"|".join([TOKEN_VERSION.encode(), request_type.encode(), issued.encode(), _digest_ids(input_ids)])
    return hmac.new(derive_key(key, "orchestrator"), message, hashlib.sha256).hexdigest()


def orchestrator_token(key: bytes, request_type: str, input_ids, now_s: float) -> str:
    """The `trtpd_auth` value for a request of this type ("context_only", "generation_only" or "" for a
    full request) over these prompt tokens."""
    issued = f"{now_s:.3f}"
    return f"{TOKEN_VERSION}:{issued}:{_token_mac(key, request_type, issued, input_ids)}"


def check_orchestrator_token(key: bytes, token, request_type: str, input_ids, now_s: float, model: str) -> None:
    """Raises OrchestratorAuthError saying what was refused and why."""
    refused = (f"permission denied: {model} serves only the deployment's orchestrator (disagg_bls); send requests "
               f"to the ensemble model. This request was refused because")
    if not token:
        raise OrchestratorAuthError(f"{refused} it carries no {AUTH_PARAMETER} parameter")
    parts = str(token).split(":")
    if len(parts) != 3 or parts[0] != TOKEN_VERSION:
        raise OrchestratorAuthError(f"{refused} its {AUTH_PARAMETER} parameter is not a {TOKEN_VERSION} token")
    _, issued, mac = parts
    try:
        issued_s = float(issued)
    except ValueError:
        raise OrchestratorAuthError(f"{refused} its {AUTH_PARAMETER} parameter is malformed") from None
    if not hmac.compare_digest(mac.encode(), _token_mac(key, request_type, issued, input_ids).encode()):
        raise OrchestratorAuthError(
            f"{refused} its {AUTH_PARAMETER} does not verify for this request (another key, request type or "
            f"prompt)")
    if abs(now_s - issued_s) > ORCHESTRATOR_TOKEN_MAX_AGE_S:
        raise OrchestratorAuthError(
            f"{refused} its {AUTH_PARAMETER} was issued {now_s - issued_s:.0f} s ago, outside the "
            f"{ORCHESTRATOR_TOKEN_MAX_AGE_S:.0f} s it is valid (replayed, or the clocks differ)")


def gateway_admin_token(key: bytes) -> str:
    """What a deployment's controller sends (Bearer) to its gateway's /admin endpoints: derived from the
    deployment key, so only its owner (the key file is 0600) can drain, reload or read request samples."""
    return derive_key(key, "gateway-admin").hex()


def cluster_token(key: bytes) -> str:
    """What a worker sends (Bearer) to register with a deployment's gateway as a disagg cluster member
    (trtpd/gateway/cluster_store.py): derived from the deployment key, so only a worker that holds it can make the
    gateway route clients' requests to it."""
    return derive_key(key, "cluster-member").hex()

"""The key proofs of auth.py: pull challenge-response and orchestrator tokens."""

import numpy as np
import pytest

from trtpd.kv import auth
from trtpd.kv.auth import KvPeerAuthError, OrchestratorAuthError
from trtpd.kv.handle import generate_key

KEY = generate_key()
HANDLE = b"TPDH" + bytes(40)


def test_a_pull_proof_verifies_only_for_its_key_challenge_and_handle():
    challenge = auth.new_nonce()
    payload, importer_nonce = auth.pack_pull(KEY, challenge, HANDLE)
    assert auth.unpack_pull(KEY, challenge, payload) == (importer_nonce, HANDLE)
    with pytest.raises(KvPeerAuthError, match="did not prove it holds the deployment's KV key"):
        auth.unpack_pull(generate_key(), challenge, payload)                 # another key
    with pytest.raises(KvPeerAuthError):
        auth.unpack_pull(KEY, auth.new_nonce(), payload)                     # replayed on another challenge
    with pytest.raises(KvPeerAuthError):
        auth.unpack_pull(KEY, challenge, payload[:-1] + bytes([payload[-1] ^ 1]))   # another handle
    with pytest.raises(KvPeerAuthError, match="too few"):
        auth.unpack_pull(KEY, challenge, payload[:40])


def test_the_two_directions_use_different_keys():
    e, i = auth.new_nonce(), auth.new_nonce()
    assert auth.importer_proof(KEY, e, i, HANDLE) != auth.exporter_proof(KEY, e, i, HANDLE)
    auth.check_exporter_proof(KEY, e, i, HANDLE, auth.exporter_proof(KEY, e, i, HANDLE), "pull")
    with pytest.raises(KvPeerAuthError, match="pull: the endpoint did not prove"):
        auth.check_exporter_proof(KEY, e, i, HANDLE, auth.importer_proof(KEY, e, i, HANDLE), "pull")   # reflected


IDS = np.array([[5, 6, 7, 8]], dtype=np.int32)


def test_an_orchestrator_token_verifies_for_its_request_only():
    token = auth.orchestrator_token(KEY, "context_only", IDS, 1000.0)
    auth.check_orchestrator_token(KEY, token, "context_only", IDS.astype(np.int64).reshape(-1), 1010.0, "prefill")
    cases = [(generate_key(), token, "context_only", IDS, 1000.0, "does not verify"),
             (KEY, token, "generation_only", IDS, 1000.0, "does not verify"),
             (KEY, token, "context_only", IDS + 1, 1000.0, "does not verify"),
             (KEY, token, "context_only", IDS, 1000.0 + auth.ORCHESTRATOR_TOKEN_MAX_AGE_S + 1, "outside"),
             (KEY, token, "context_only", IDS, 1000.0 - auth.ORCHESTRATOR_TOKEN_MAX_AGE_S - 1, "outside"),
             (KEY, token.replace(":1000.000:", ":2000.000:"), "context_only", IDS, 2000.0, "does not verify"),
             (KEY, None, "context_only", IDS, 1000.0, "carries no trtpd_auth"),
             (KEY, "hello", "context_only", IDS, 1000.0, "not a v1 token"),
             (KEY, "v1:x:00", "context_only", IDS, 1000.0, "malformed")]
    for key, tok, kind, ids, now, why in cases:
        with pytest.raises(OrchestratorAuthError, match=why) as refused:
            auth.check_orchestrator_token(key, tok, kind, ids, now, "prefill")
        assert str(refused.value).startswith("permission denied: prefill serves only the deployment's orchestrator")

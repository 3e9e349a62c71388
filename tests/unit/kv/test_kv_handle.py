import dataclasses
import os
import stat

import pytest

from trtpd.errors import ConfigError
from trtpd.kv.errors import (KvHandleExpiredError, KvHandleForgedError, KvHandleMalformedError,
                             KvLayoutMismatchError, KvTransferError)
from trtpd.kv.handle import (HANDLE_VERSION, MAGIC, TAG_BYTES, ContextPhaseParams, check_layout, decode, encode,
                             generate_key, load_or_create_key_file)
from trtpd.kv.layout import KvLayout

KEY = bytes(range(32))
LAYOUT = KvLayout(num_layers=80, num_kv_heads=8, head_size=128, tokens_per_block=32, dtype="fp8",
                  scales_digest="abc123")


def make_params(first_token=None, issued_at_s=1000.0, expires_at_s=1030.0) -> ContextPhaseParams:
    return ContextPhaseParams(HANDLE_VERSION, "tcp://10.0.0.5:41000", "req-7", LAYOUT, 2048, first_token,
                              issued_at_s, expires_at_s)


@pytest.mark.parametrize("first_token", [None, 0, 31999])
def test_round_trip_keeps_every_field(first_token):
    params = make_params(first_token)
    assert decode(encode(params, KEY), KEY, now_s=1010.0) == params


def test_encoding_is_deterministic_so_the_importer_can_re_sign():
    assert encode(make_params(5), KEY) == encode(make_params(5), KEY)


def test_every_flipped_byte_after_the_magic_is_refused_as_forged():
    blob = encode(make_params(5), KEY)
    for i in range(len(MAGIC), len(blob)):
        forged = bytearray(blob)
        forged[i] ^= 0x01
        with pytest.raises(KvHandleForgedError, match="signature does not verify"):
            decode(bytes(forged), KEY, now_s=1010.0)


def test_a_changed_first_token_with_the_old_signature_is_forged():
    blob = encode(make_params(5), KEY)
    other = encode(make_params(6), KEY)
    spliced = blob[:len(MAGIC) + TAG_BYTES] + other[len(MAGIC) + TAG_BYTES:]
    with pytest.raises(KvHandleForgedError):
        decode(spliced, KEY, now_s=1010.0)


def test_wrong_key_is_forged_and_says_to_share_the_key_file():
    blob = encode(make_params(5), KEY)
    with pytest.raises(KvHandleForgedError, match="same key file"):
        decode(blob, generate_key(), now_s=1010.0)


@pytest.mark.parametrize("blob", [b"", b"TPDH", b"XXXX" + bytes(40), MAGIC + bytes(TAG_BYTES)])
def test_garbage_is_malformed(blob):
    with pytest.raises(KvHandleMalformedError, match="not a trtpd KV handle"):
        decode(blob, KEY, now_s=0.0)


def test_other_handle_version_is_malformed_even_when_signed():
    params = dataclasses.replace(make_params(), version=HANDLE_VERSION + 1)
    with pytest.raises(KvHandleMalformedError, match="version"):
        decode(encode(params, KEY), KEY, now_s=1010.0)


def test_expired_handle_is_stale_and_names_the_request():
    blob = encode(make_params(5), KEY)
    assert decode(blob, KEY, now_s=1030.0).first_token == 5          # the last valid instant
    with pytest.raises(KvHandleExpiredError, match="'req-7' expired 0.500 s ago"):
        decode(blob, KEY, now_s=1030.5)


def test_handle_errors_are_kv_transfer_errors():
    for cls in (KvHandleForgedError, KvHandleExpiredError, KvHandleMalformedError, KvLayoutMismatchError):
        assert issubclass(cls, KvTransferError)


def test_layout_mismatch_lists_every_difference():
    decode_layout = KvLayout(num_layers=40, num_kv_heads=8, head_size=128, tokens_per_block=64, dtype="fp16")
    with pytest.raises(KvLayoutMismatchError) as info:
        check_layout(make_params(), decode_layout)
    message = str(info.value)
    assert "'req-7'" in message and "tcp://10.0.0.5:41000" in message and "nothing was pulled" in message
    for line in LAYOUT.mismatches(decode_layout, "prefill", "decode"):
        assert line in message
    assert len(info.value.problems) == 4       # dtype, tokens_per_block, num_layers, scales_digest
    assert "KV dtype differs: prefill has fp8, decode has fp16" in message


def test_matching_layout_passes():
    check_layout(make_params(), dataclasses.replace(LAYOUT))


def test_short_key_is_refused():
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        encode(make_params(), b"short")


def test_key_file_is_created_0600_and_read_back(tmp_path):
    path = tmp_path / "secrets" / "kv.key"
    key = load_or_create_key_file(path)
    assert len(key) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_key_file(path) == key


def test_key_file_readable_by_others_is_refused(tmp_path):
    path = tmp_path / "kv.key"
    load_or_create_key_file(path)
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        load_or_create_key_file(path)


def test_key_file_with_garbage_is_refused(tmp_path):
    path = tmp_path / "kv.key"
    path.write_text("not hex\n")
    os.chmod(path, 0o600)
    with pytest.raises(ConfigError, match="delete it"):
        load_or_create_key_file(path)

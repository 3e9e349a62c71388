import pytest
import torch

from trtpd.schema.manifest import load_manifest
from trtpd.engine.reference_engines import build_reference
from trtpd.engine.checkpoint import load_checkpoint
from trtpd.engine.engine_config import EngineConfig, Role
from trtpd.errors import ConfigError


def test_build_writes_checkpoint_and_role_engines(fp16_root):
    for role in Role:
        config = EngineConfig.load(fp16_root / f"{role.value}-tp1")
        assert config.role is role and config.tokens_per_block == 32
        manifest = load_manifest(fp16_root / f"{role.value}-tp1")
        assert manifest.status == "complete" and manifest.backend == "reference" and manifest.role == role.value
        assert {c.path for c in manifest.checksums} >= {"config.json", "../checkpoint/model.safetensors"}
    prefill = EngineConfig.load(fp16_root / "prefill-tp1")
    decode = EngineConfig.load(fp16_root / "decode-tp1")
    assert prefill.max_batch_size < decode.max_batch_size        # role-tuned
    assert prefill.max_num_tokens > decode.max_num_tokens
    assert decode.max_seq_len >= prefill.max_input_len


def test_build_is_deterministic_and_skips_when_unchanged(tmp_path, fp16_root):
    messages = []
    build_reference("tiny-llama", tmp_path, kv_dtype="fp16", progress=messages.append)
    mine = load_manifest(tmp_path / "tiny-llama/reference-fp16/prefill-tp1")
    theirs = load_manifest(fp16_root / "prefill-tp1")
    assert mine.checksums == theirs.checksums
    messages.clear()
    build_reference("tiny-llama", tmp_path, kv_dtype="fp16", progress=messages.append)
    assert any("up to date" in m for m in messages)


def test_fp8_checkpoint_carries_calibrated_scales(fp8_root):
    ckpt = load_checkpoint(fp8_root / "checkpoint")
    assert ckpt.kv_dtype.value == "fp8"
    assert all(0 < s < 1 for s in ckpt.k_scales + ckpt.v_scales)
    assert ckpt.layout(32).scales_digest is not None
    assert load_manifest(fp8_root / "decode-tp1").kv_scales_digest == ckpt.layout(32).scales_digest


@pytest.mark.parametrize("kwargs, message", [
    ({"model": "llama-2-70b"}, "reference backend runs on the CPU"),
    ({"model": "no-such-model"}, "unknown model"),
    ({"model": "tiny-llama", "max_input_len": 4000, "max_output_len": 512}, "max_position_embeddings"),
])
def test_bad_input_is_refused_and_leaves_nothing(tmp_path, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        build_reference(engines_dir=tmp_path, **kwargs)
    assert not any(tmp_path.rglob("*.json"))


def test_an_engine_whose_kernel_is_not_batch_invariant_refuses_to_load(fp16_root):
    from trtpd.engine.loader import BatchInvarianceError, load_model

    def coupled(x, weight):
        return torch.nn.functional.linear(x, weight) + 1e-6 * x.sum(0, keepdim=True).mean()

    with pytest.raises(BatchInvarianceError, match="batch invariance does not hold on this machine.*refusing to load"):
        load_model(fp16_root / "prefill-tp1", linear=coupled)
    config, _, _, report = load_model(fp16_root / "prefill-tp1")
    assert report.ok and report.max_rows == config.max_num_tokens

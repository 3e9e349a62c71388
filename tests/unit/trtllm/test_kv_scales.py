"""Reading a TensorRT-LLM checkpoint's FP8 KV scales back: the safetensors header only, every rank, PP stages in
model order; files written by the safetensors library itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from trtpd.trtllm.kv_scales import KvScalesError, read_kv_scales, require_same_scales


def write_rank(path: Path, layers: dict[int, float], *, rcp: bool = False, dtype=np.float32) -> None:
    tensors = {"lm_head.weight": np.ones((8, 4), dtype=np.float16)}
    for layer, scale in layers.items():
        prefix = f"transformer.layers.{layer}.attention."
        tensors[prefix + "dense.weight"] = np.ones((4, 4), dtype=np.uint8)     # an FP8 weight, as bytes
        tensors[prefix + "kv_cache_scaling_factor"] = np.array([scale], dtype=dtype)
        if rcp:
            tensors[prefix + "kv_cache_rcp_scaling_factor"] = np.array([1 / scale], dtype=dtype)
    save_file(tensors, str(path))


def checkpoint(folder: Path, tp: int, pp: int, scales: list[float], *, local_layer_numbers: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    per_stage = len(scales) // pp
    for rank in range(tp * pp):
        stage = rank // tp
        mine = scales[stage * per_stage:(stage + 1) * per_stage]
        first = 0 if local_layer_numbers else stage * per_stage
        write_rank(folder / f"rank{rank}.safetensors", {first + i: s for i, s in enumerate(mine)})
    return folder


SCALES = [0.01, 0.02, 0.03, 0.04]


def test_the_digest_does_not_depend_on_tp(tmp_path):
    tp1 = read_kv_scales(checkpoint(tmp_path / "tp1", 1, 1, SCALES), 1)
    tp4 = read_kv_scales(checkpoint(tmp_path / "tp4", 4, 1, SCALES), 4)
    assert [dict(layer)["kv_cache_scaling_factor"] for layer in tp4.layers] == \
        pytest.approx(SCALES)                                               # float32 values
    assert tp1.digest == tp4.digest
    require_same_scales(tp1, tp4)


@pytest.mark.parametrize("local", [False, True])
def test_pipeline_stages_are_read_in_model_order(tmp_path, local):
    pp2 = read_kv_scales(checkpoint(tmp_path / "pp2", 2, 2, SCALES, local_layer_numbers=local), 2, 2)
    assert pp2.digest == read_kv_scales(checkpoint(tmp_path / "tp1", 1, 1, SCALES), 1).digest


def test_one_changed_scale_changes_the_digest_and_is_refused_naming_the_field(tmp_path):
    a = read_kv_scales(checkpoint(tmp_path / "a", 2, 1, SCALES), 2)
    b = read_kv_scales(checkpoint(tmp_path / "b", 4, 1, [0.01, 0.02, 0.0300001, 0.04]), 4)
    assert a.digest != b.digest
    with pytest.raises(KvScalesError, match=r"^kv_scales_digest differs: .*first difference at layer 2"):
        require_same_scales(a, b)


def test_reciprocal_scales_are_part_of_the_digest(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    write_rank(plain / "rank0.safetensors", {0: 0.5})
    both = tmp_path / "both"
    both.mkdir()
    write_rank(both / "rank0.safetensors", {0: 0.5}, rcp=True)
    assert dict(read_kv_scales(both, 1).layers[0]) == {"kv_cache_scaling_factor": 0.5,
                                                       "kv_cache_rcp_scaling_factor": 2.0}
    assert read_kv_scales(plain, 1).digest != read_kv_scales(both, 1).digest


def test_ranks_of_one_tp_group_that_disagree_are_refused(tmp_path):
    folder = checkpoint(tmp_path / "ckpt", 2, 1, SCALES)
    write_rank(folder / "rank1.safetensors", {0: 0.01, 1: 0.02, 2: 0.03, 3: 0.05})
    with pytest.raises(KvScalesError, match=r"rank1.safetensors holds other FP8 KV scales than rank0.safetensors"):
        read_kv_scales(folder, 2)


@pytest.mark.parametrize("setup, message", [
    (lambda d: checkpoint(d, 1, 1, SCALES), r"rank1.safetensors missing for TP2 PP1"),
    (lambda d: [save_file({"w": np.zeros(2, dtype=np.float16)}, str(d / f"rank{r}.safetensors")) for r in range(2)],
     r"no KV scaling factors .* --kv_cache_dtype fp8"),
    (lambda d: [(d / f"rank{r}.safetensors").write_bytes(b"weights") for r in range(2)],
     r"not a safetensors file"),
    (lambda d: [write_rank(d / f"rank{r}.safetensors", {0: 0.5}, dtype=np.float16) for r in range(2)],
     r"kv_cache_scaling_factor is F16 \[1\]; TensorRT-LLM's KV scaling factors are float32 scalars"),
])
def test_unreadable_checkpoints_are_refused_naming_the_file(tmp_path, setup, message):
    setup(tmp_path)
    with pytest.raises(KvScalesError, match=message):
        read_kv_scales(tmp_path, 2)

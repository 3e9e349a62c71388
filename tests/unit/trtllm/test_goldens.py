"""Golden outputs of `trtpd build` for the issue's three cases (plans only: nothing is built).

Regenerate after an intended change, then review the diff:
    TRTPD_REGEN_GOLDENS=1 .venv/bin/python -m pytest tests/unit/trtllm/test_goldens.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trtpd.trtllm.run import prepare

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "golden" / "trtllm"
REGEN = os.environ.get("TRTPD_REGEN_GOLDENS") == "1"


def golden_files(prepared) -> dict[str, str]:
    files = {"plan.txt": prepared.text()}
    for role in prepared.plan.roles:
        files[f"manifests/{role.engine_dir.name}.json"] = role.manifest.to_json()
    for name in ("prefill", "decode"):
        files[f"model_repository/{name}/config.pbtxt"] = prepared.configs[name]
    files.update(prepared.deploy.files)
    return files


@pytest.mark.parametrize("case", ["llama-2-70b-tp4-tp4-fp8", "llama-2-70b-tp2-tp4-fp8", "llama-3.1-8b-tp1-tp1-fp16"])
def test_golden(case, golden_cases, request_for):
    model, overrides = golden_cases[case]
    files = golden_files(prepare(request_for(model, **overrides)))
    folder = GOLDEN_DIR / case
    if REGEN:
        for rel, text in files.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text(text)
    on_disk = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert on_disk == sorted(files), f"golden files of {case} differ; regenerate (see module docstring)"
    for rel, text in files.items():
        assert (folder / rel).read_text() == text, (f"{case}/{rel} differs from the golden; if intended, "
                                                    f"regenerate with TRTPD_REGEN_GOLDENS=1 and review the diff")

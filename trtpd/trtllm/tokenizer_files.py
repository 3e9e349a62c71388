"""The tokenizer the GPU deployment serves with: a copy in the deploy folder, never a hub id.

Pre/postprocessing read `<deploy>/tokenizer/tokenizer.json` (engine/text_tokenizers.py, no download) and the
trtllm-serve servers get `--tokenizer <deploy>/tokenizer`, a folder a Hugging Face tokenizer loads from. The
containers get no HF_TOKEN and no hub cache, so a hub id there would mean a download of a gated model at start
(and a 401 without a token); a local copy next to the engines means none.

`trtpd build` fills the folder from the first of: --tokenizer-dir, the --hf-model/--model folder, or the local
Hugging Face hub cache entry of the model's hub id, which quantize.py/convert_checkpoint.py filled while
building. It never downloads. The hub cache layout (huggingface.co/docs/hub/local-cache, "Hub Local Cache"):
`$HF_HUB_CACHE` (takes priority), else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`; in it
`models--<org>--<name>/refs/main` holds the commit whose files are in `snapshots/<commit>/`. The fetch command
in the error is huggingface_hub's CLI (`hf download REPO FILE...`; `huggingface-cli download` before 1.0:
huggingface.co/docs/huggingface_hub guides/cli, main and v0.30).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from trtpd.errors import ConfigError

TOKENIZER_DIR = "tokenizer"                  # under the deploy folder
REQUIRED = "tokenizer.json"                  # what trtpd's pre/postprocessing read
TOKENIZER_FILES = (REQUIRED, "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "added_tokens.json", "generation_config.json", "config.json")


def served_tokenizer_dir(model_dir: Path) -> Path:
    """Where the deployment reads its tokenizer: engines/<model>/deploy/tokenizer (absolute, as every path in the
    configs is; the containers mount engines/<model> at the same path)."""
    return Path(model_dir) / "deploy" / TOKENIZER_DIR


def guard_lines(script: str, folder: str) -> list[str]:
    """Shell lines that stop a launch script at once when the deploy folder has no tokenizer."""
    return [f'if [ ! -f "{folder}/{REQUIRED}" ]; then',
            f'  echo "{script}: {folder}/{REQUIRED} is missing: the servers read the tokenizer from there and download '
            f'nothing; rerun trtpd build --configs-only --force --tokenizer-dir /path/to/checkpoint" >&2',
            "  exit 1",
            "fi"]


def hub_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def hub_snapshot(repo_id: str, cache: Path | None = None) -> Path | None:
    """The cached snapshot of `repo_id`'s main revision, or None when it is not in the local cache."""
    repo = (cache or hub_cache_dir()) / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / "main"
    if not ref.is_file():
        return None
    snapshot = repo / "snapshots" / ref.read_text().strip()
    return snapshot if snapshot.is_dir() else None


def tokenizer_source(source: str) -> tuple[Path | None, str]:
    """(a local folder holding tokenizer.json, or None; where it was looked for) for a folder or a hub id."""
    folder = Path(source)
    if folder.is_dir():
        return (folder if (folder / REQUIRED).is_file() else None), str(folder)
    snapshot = hub_snapshot(source)
    looked = f"the Hugging Face cache {hub_cache_dir()} (entry models--{source.replace('/', '--')})"
    return (snapshot if snapshot is not None and (snapshot / REQUIRED).is_file() else None), looked


def copy_tokenizer(source: str, dest: Path) -> list[str]:
    """Copies the tokenizer files of `source` (folder or hub id) to `dest`; raises ConfigError when none is local."""
    folder, looked = tokenizer_source(source)
    if folder is None:
        raise ConfigError(missing_message(source, looked))
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            shutil.copyfile(folder / name, dest / name)      # follows the cache's symlinks into blobs/
            copied.append(name)
    return copied


def missing_message(source: str, looked: str) -> str:
    return (f"tokenizer for {source}: no {REQUIRED} in {looked}; the deployment reads its tokenizer from the deploy "
            f"folder and downloads nothing. Pass --tokenizer-dir /path/to/checkpoint (any folder with "
            f"{REQUIRED}), or fetch it once on this machine, HF_TOKEN set for a gated model: "
            f"hf download {source} {' '.join(TOKENIZER_FILES[:3])} (huggingface-cli download before "
            f"huggingface_hub 1.0)")

"""All-or-nothing output folders: write into a hidden sibling, move into place only on success."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trtpd.errors import ConfigError


@contextmanager
def staged_folder(target: Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Yields an empty staging folder next to `target`; on success it replaces `target`, on any error it
    is removed and an existing `target` stays as it was."""
    target = Path(target)
    if target.exists() and not overwrite:
        raise ConfigError(f"{target} already exists; pass --force to replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    staging.chmod(0o755)
    try:
        yield staging
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise

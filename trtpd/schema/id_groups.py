"""The tensorrtllm model's `participant_ids` and `gpu_device_ids`: ';'-separated groups of ','-separated ids.

`trtpd build` writes them (trtpd.trtllm.mpi_world) and `trtpd lint` reads them back (trtpd.lint.repository).
"""

from __future__ import annotations

from trtpd.errors import ConfigError


def format_id_groups(groups: list[tuple[int, ...]]) -> str:
    return ";".join(",".join(str(i) for i in g) for g in groups)


def parse_id_groups(text: str, field: str) -> list[list[int]]:
    """'1,2;3,4' -> [[1, 2], [3, 4]]; raises ConfigError naming `field` for anything else."""
    try:
        groups = [[int(x) for x in group.split(",")] for group in text.strip().split(";")]
    except ValueError:
        raise ConfigError(f"{field}: {text!r} is not a list of integer groups like '1,2;3,4'") from None
    if any(i < 0 for g in groups for i in g):
        raise ConfigError(f"{field}: {text!r} has a negative id")
    return groups

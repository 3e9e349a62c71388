"""One MPI world for Triton's tensorrtllm C++ backend with context/generation disaggregation.

In that backend the KV transport is MPI (CacheTransceiverConfig(BackendType::MPI) is hard-coded),
so every executor shares one MPI world: rank 0 is the orchestrator, then the ranks of every
prefill instance, then those of every decode instance. world_size = sum of TP*PP over instances
+ 1. The tensorrtllm model's `participant_ids` are these MPI ranks, one group per instance
separated by ';' (instance i takes group i), and must not intersect between models
(trtllm-1.2.md §2.2, §3.1, §3.5).
"""

from __future__ import annotations

from dataclasses import dataclass

from trtpd.build.spec import BuildRequest
from trtpd.errors import ConfigError


@dataclass(frozen=True)
class InstanceRanks:
    role: str
    index: int
    ranks: tuple[int, ...]          # MPI ranks = participant ids; TP*PP of them
    gpu_ids: tuple[int, ...]        # CUDA device per rank, same order


@dataclass(frozen=True)
class MpiWorld:
    prefill: tuple[InstanceRanks, ...]
    decode: tuple[InstanceRanks, ...]

    @property
    def num_worker_ranks(self) -> int:
        return sum(len(i.ranks) for i in (*self.prefill, *self.decode))

    @property
    def world_size(self) -> int:
        return self.num_worker_ranks + 1          # + orchestrator rank 0

    def instances(self, role: str) -> tuple[InstanceRanks, ...]:
        return self.prefill if role == "prefill" else self.decode

    def participant_ids(self, role: str) -> str:
        return format_id_groups([i.ranks for i in self.instances(role)])

    def gpu_device_ids(self, role: str) -> str:
        return format_id_groups([i.gpu_ids for i in self.instances(role)])


def plan_mpi_world(r: BuildRequest) -> MpiWorld:
    rank, gpu, groups = 1, 0, {}
    for spec in r.roles:
        instances = []
        for index in range(spec.instances):
            n = spec.gpus_per_instance
            instances.append(InstanceRanks(spec.role, index, tuple(range(rank, rank + n)),
                                           tuple(range(gpu, gpu + n))))
            rank, gpu = rank + n, gpu + n
        groups[spec.role] = tuple(instances)
    return MpiWorld(groups["prefill"], groups["decode"])


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

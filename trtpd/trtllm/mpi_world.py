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

from trtpd.trtllm.spec import BuildRequest
from trtpd.schema.id_groups import format_id_groups


@dataclass(frozen=True)
class InstanceRanks:
    role: str
    index: int
    ranks: tuple[int, ...]          # MPI ranks = participant ids; TP*PP of them
    gpu_ids: tuple[int, ...]        # CUDA device per rank, same order


@dataclass(frozen=True)
class RankLayout:
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


def plan_mpi_world(r: BuildRequest) -> RankLayout:
    rank, gpu, groups = 1, 0, {}
    for spec in r.roles:
        instances = []
        for index in range(spec.instances):
            n = spec.gpus_per_instance
            instances.append(InstanceRanks(spec.role, index, tuple(range(rank, rank + n)),
                                           tuple(range(gpu, gpu + n))))
            rank, gpu = rank + n, gpu + n
        groups[spec.role] = tuple(instances)
    return RankLayout(groups["prefill"], groups["decode"])

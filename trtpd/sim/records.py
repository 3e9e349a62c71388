"""Per-request timestamps the simulator fills in (flat lists indexed by request: cheap to write)."""

from __future__ import annotations

import math

from trtpd.sim.workload import RequestArrays


class RequestRecords:
    def __init__(self, requests: RequestArrays) -> None:
        n = len(requests)
        self.arrival_s = requests.arrival_s
        self.input_tokens = requests.input_tokens
        self.output_tokens = requests.output_tokens
        self.prefill_start_s = [math.nan] * n     # its prefill batch started (colocated: its step started)
        self.prefill_end_s = [math.nan] * n
        self.transfer_start_s = [math.nan] * n    # decode admitted it and began pulling KV
        self.transfer_end_s = [math.nan] * n
        self.first_token_s = [math.nan] * n
        self.done_s = [math.nan] * n
        self.prefill_instance = [0] * n
        self.decode_instance = [-1] * n           # the decode (or colocated) instance's index, once routed there
        self.rejected = [False] * n               # refused on arrival (too long for every instance)
        self.num_done = 0

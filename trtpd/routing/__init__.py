"""The routing core: which prefill/decode/colocated instance serves a request, and what to do when a
step fails. Pure (no I/O, no threads, no wall clock): the gateway and the simulator both call it."""

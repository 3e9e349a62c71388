"""Pure scheduling policies shared by the reference engine and the simulator (no I/O, no tensors)."""

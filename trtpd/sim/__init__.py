"""Discrete-event simulator of disaggregated and colocated serving (heapq event loop)."""

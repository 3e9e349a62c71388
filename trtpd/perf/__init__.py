"""Performance models per role: prefill latency vs batched tokens, decode step latency vs batch size
and context length. Measured profiles (interpolated) where they exist, a roofline estimate otherwise."""

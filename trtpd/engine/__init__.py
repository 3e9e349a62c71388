"""The CPU reference engine: a Llama-architecture decoder with a paged KV cache, in torch."""

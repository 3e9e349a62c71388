"""A CPU twin of a `trtllm-serve` worker: the reference engine behind trtllm-serve's command line and HTTP API.

`python -m trtpd.serve_twin MODEL --server_role CONTEXT ...` takes the flags and the `--extra_llm_api_options` YAML
of `trtllm-serve` (TensorRT-LLM 1.2.1's `tensorrt_llm/commands/serve.py`; GPU-only ones accepted and named as
ignored) and serves `/v1/completions` with `disaggregated_params`, `/health` and `/metrics` in trtllm-serve's
shapes (docs/serve-twin.md maps each behaviour to its upstream source and its test). KV moves between twins over
trtpd's own transports (trtpd/kv/), signed with the deployment key.
"""

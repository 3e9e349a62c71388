"""`trtpd build` for TensorRT-LLM 1.2.x: per-role plans, execution with manifests, serving configs."""

"""The OpenAI-compatible gateway in front of a fleet of prefill and decode (or colocated) instances.

It runs in its own process (uvicorn), never inside Triton's python stub: the fleet's Triton entry sends its
requests here (POST /admin/generate). Each request goes through the fleet service (service.py: admission, the
canary cohort, metrics, samples) and the one orchestrator (trtpd/orchestration), which reaches the instances
through tritonclient's gRPC asyncio client with TensorRT-LLM's tensor interface (trtpd/transports/triton_grpc.py) and decides
where each request goes through the routing core (trtpd/routing), which the simulator uses too.
"""

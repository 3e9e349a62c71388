"""The OpenAI-compatible gateway in front of a fleet of prefill and decode (or colocated) instances.

Host-side code: it runs in its own process (uvicorn), never inside Triton's python stub. It speaks to
the instances through tritonclient's gRPC asyncio client with TensorRT-LLM's tensor interface, exactly
as the in-server orchestrator (trtpd/serving/bls_model.py) does, and decides where each request goes
through the routing core (trtpd/routing), which the simulator uses too.
"""

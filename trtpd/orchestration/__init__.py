"""The request's choreography, written once: prefill -> KV -> decode (or one colocated instance) as the routing
core decides, with retries that exclude the failed instance, prefill again when the KV pull fails, give-up of
an export no decode will pull, cancellation, first-token handling and timing (orchestrator.py), over a
RoleTransport (transport.py) that carries one sub-request to one role instance. The gateway and the fleet's
Triton entry run it; its first transport is Triton's gRPC stream (trtpd/transports/triton_grpc.py). Pure of any
transport: this package imports no process, socket or client module."""

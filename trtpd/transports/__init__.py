"""The RoleTransports (trtpd/orchestration/transport.py): how the one orchestrator reaches a role instance.
triton_grpc.py: Triton's gRPC stream to a role model (the gateway's way to a fleet's instances, and the single
server's entry's way to its own server's role models). Runs wherever its orchestrator runs: the gateway process
or the single server's python stub."""

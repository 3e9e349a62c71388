"""Load generation against a running deployment: prompts, a streaming gRPC client, statistics."""

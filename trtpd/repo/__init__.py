"""Triton model repositories: strict template rendering and validation."""

"""Code that runs inside Triton's python-backend stub: the role models around trtpd's engines (role_model.py), the
ensemble's BLS orchestrator (bls_model.py) and its way into a fleet (fleet_bridge.py), pre/post-processing
(text_models.py), and the stub's own watch (stub_watch.py: its registry, guards and reaper). Starting, watching
and stopping tritonservers is host-side process control: trtpd/fleet/ (tritonserver.py, deployment.py)."""

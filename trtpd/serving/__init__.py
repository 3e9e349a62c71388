"""Code that runs inside Triton's python-backend stub: the role models around trtpd's engines (role_model.py), the
ensemble's entry (bls_model.py: the one orchestrator over its own server's role models, found by own_server.py;
or, in a fleet, the way to the fleet's gateway, fleet_bridge.py), pre/post-processing (text_models.py), and the stub's own watch (stub_watch.py: its registry, guards and reaper). Starting, watching
and stopping tritonservers is host-side process control: trtpd/fleet/ (tritonserver.py, deployment.py)."""

"""What a deployment is made of, as host-side data with no I/O of its own (no rendering, no processes).

    spec   ReferenceDeployment: which engines, how many instances per role, the KV transport, and
           where the deployment's KV signing key sits next to its repository

Rendering is trtpd.repo.reference; the P/D compatibility rules are trtpd.lint.engine_pair; starting
servers is trtpd.fleet.deployment (one server) and trtpd.fleet (one server per instance).
"""

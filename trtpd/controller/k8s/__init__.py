"""Kubernetes for the controller: manifests (pure) and an executor through the official client.

`manifests`, `fleet_file` and `from_spec` need only PyYAML; `executor` and `cluster` (the CLI's `up`, `status`,
`down` on a cluster) import `kubernetes` (pip install -e ".[k8s]"), so
importing trtpd.controller never needs it.
"""

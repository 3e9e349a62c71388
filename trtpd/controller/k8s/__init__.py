"""Kubernetes for the controller: manifests (pure) and an executor through the official client.

`manifests` and `fleet_file` need only PyYAML; `executor` imports `kubernetes` (pip install -e ".[k8s]"), so
importing trtpd.controller never needs it.
"""

"""The controller: desired state (revisions of a deployment spec) against what runs, reconciled by pure
cores (reconcile, rollout, autoscale) whose actions one executor interface carries out (local processes
or Kubernetes)."""

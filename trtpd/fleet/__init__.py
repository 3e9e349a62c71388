"""A fleet: each prefill, decode or colocated instance is its own tritonserver process (own ports, own
state folder, own cores), so it can be started, drained, killed or replaced alone, as a pod would be.
records.py: fleet.json; instance.py: render and start one instance; launcher.py: up, down, status."""

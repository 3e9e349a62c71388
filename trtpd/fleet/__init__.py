"""Host-side process control: starting, watching and stopping tritonservers and the processes around them, and the
records of what runs. tritonserver.py: one server (start with the pid + start-time identity, readiness, stop and
clean-up); server_guard.py: the admin key of Triton's restricted APIs; records.py: fleet.json, the one record
every bring-up writes; deployment.py: the single-server deployment (`trtpd up`, one instance of role "server");
a fleet, where each prefill, decode or colocated instance is its own tritonserver (own ports, state folder,
cores), started, drained, killed or replaced alone as a pod would be: instance.py (render and start one
instance), launcher.py (up, down, status), state.py;
supervisor.py and gateway_process.py (the gateway and the controller under supervisord)."""

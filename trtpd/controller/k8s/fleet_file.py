"""The gateway's fleet.json on Kubernetes: held in a ConfigMap, mounted into the gateway pod.

The one fleet-file model (trtpd/schema/fleet_file.py, as a local fleet writes it and the gateway reads it), with
paths inside the pods: the key is the mounted Secret and the tokenizer the checkpoint folder in the engines mount. The executor rewrites it as
pods come and go, drain, and as the traffic split changes; the kubelet updates the mounted file on its
next sync (about a minute), and the gateway re-reads a changed file.
"""

from __future__ import annotations

import json

from trtpd.schema.fleet_file import FleetFile, RoutedInstance
from trtpd.trtllm.spec import EngineRoleSpec

KEY_DIR = "/etc/trtpd/kv"
KEY_FILE = f"{KEY_DIR}/key"
FLEET_DIR = "/etc/trtpd/fleet"
FLEET_FILE = "fleet.json"


def fleet_instance(name: str, role: str, revision: int, pod_ip: str, port: int, spec: EngineRoleSpec,
                   admin_state: str = "ready") -> RoutedInstance:
    """One instance as the gateway reads it: the pod's trtllm-serve, reached over its OpenAI HTTP API with
    disaggregated_params (protocol trtllm-serve: trtpd/transports/trtllm_http.py; its load from /metrics)."""
    return RoutedInstance(name, role, role, "", f"http://{pod_ip}:{port}/metrics",
                          spec.max_input_len, spec.max_seq_len, spec.max_batch_size,
                          http_url=f"{pod_ip}:{port}", revision=revision, admin_state=admin_state,
                          protocol="trtllm-serve")


def fleet_document(name: str, mode: str, build_root: str, tokenizer_dir: str, instances: list[RoutedInstance],
                   traffic: dict | None, routing: dict | None = None) -> str:
    fleet = FleetFile(name, mode, KEY_FILE, tokenizer_dir, tuple(instances), build_root=build_root, traffic=traffic,
                      routing=routing)
    return json.dumps(fleet.to_dict(), indent=2, sort_keys=True) + "\n"

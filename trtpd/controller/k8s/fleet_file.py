"""The gateway's fleet.json on Kubernetes: held in a ConfigMap, mounted into the gateway pod.

Same fields as trtpd/fleet/records.py writes for a local fleet (the gateway reads them in
trtpd/gateway/config.py: from_fleet_file, fleet_directives), with paths inside the pods: the key is the
mounted Secret and the tokenizer the checkpoint folder in the engines mount. The executor rewrites it as
pods come and go, drain, and as the traffic split changes; the kubelet updates the mounted file on its
next sync (about a minute), and the gateway re-reads a changed file.
"""

from __future__ import annotations

import json

from trtpd.trtllm.spec import EngineRoleSpec

KEY_DIR = "/etc/trtpd/kv"
KEY_FILE = f"{KEY_DIR}/key"
FLEET_DIR = "/etc/trtpd/fleet"
FLEET_FILE = "fleet.json"


def fleet_instance(name: str, role: str, revision: int, pod_ip: str, port: int, spec: EngineRoleSpec,
                   admin_state: str = "ready") -> dict:
    """One instance as the gateway reads it. grpc_url is host:port of the pod's trtllm-serve, which speaks
    OpenAI HTTP, not Triton gRPC (see the README's Kubernetes section for what the gateway lacks there)."""
    return {"name": name, "role": role, "model": role, "revision": revision, "admin_state": admin_state,
            "grpc_url": f"{pod_ip}:{port}", "http_url": f"http://{pod_ip}:{port}",
            "metrics_url": f"http://{pod_ip}:{port}/metrics",
            "max_input_len": spec.max_input_len, "max_seq_len": spec.max_seq_len,
            "max_batch_size": spec.max_batch_size}


def fleet_document(name: str, mode: str, build_root: str, tokenizer_dir: str, instances: list[dict],
                   traffic: dict | None, routing: dict | None = None) -> str:
    fleet = {"name": name, "mode": mode, "build_root": build_root, "key_file": KEY_FILE,
             "tokenizer_dir": tokenizer_dir, "instances": instances, "gateway": None, "started_at": 0.0,
             "traffic": traffic, "routing": routing}
    return json.dumps(fleet, indent=2, sort_keys=True) + "\n"

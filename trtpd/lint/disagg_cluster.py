"""trtllm-serve's disagg_cluster: servers find the router by registering with it (TensorRT-LLM 1.2.1).

A server stores `/trtllm-disagg/<cluster_name>/workers/<id>` at its cluster_uri with a TTL of inactive_timeout_sec
and re-arms it every heartbeat_interval_sec, but starts that heartbeat only when 0 < heartbeat < timeout
(serve/disagg_auto_scaling.py DisaggClusterWorker). The router watches that prefix in storage it serves itself
for an http:// URI (openai_disagg_server.py mounts HttpClusterStorageServer's routes on its own app) and is ready
once minimal_instances of each role are registered (llmapi/disagg_utils.py DisaggClusterConfig). So a server
with another cluster_name or URI is never routed to, and one without heartbeats drops out after its TTL.
A worker YAML's disagg_cluster.cluster_uri, when present, wins over --disagg_cluster_uri: 1.2's
extract_disagg_cluster_config sets every key of the YAML's section after taking the flag (disagg_utils.py, id
103242683). Sources: docs/serve-twin.md (registration) and trtpd/trtllm/options_table.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from trtpd.lint.findings import Finding

HEARTBEAT_S, INACTIVE_TIMEOUT_S = 5, 10          # DisaggClusterConfig's defaults


def _cluster(config: Mapping) -> Mapping | None:
    value = config.get("disagg_cluster")
    return value if isinstance(value, Mapping) else None


def _heartbeat(cluster: Mapping, subject: str) -> list[Finding]:
    beat = cluster.get("heartbeat_interval_sec", HEARTBEAT_S)
    ttl = cluster.get("inactive_timeout_sec", INACTIVE_TIMEOUT_S)
    if 0 < beat < ttl:
        return []
    return [Finding("disagg-cluster", "error", f"{subject}.heartbeat_interval_sec",
                    f"heartbeat_interval_sec {beat} is not between 0 and inactive_timeout_sec {ttl}: a server then "
                    f"sends no heartbeat and its registration expires {ttl} s after it joins",
                    f"set heartbeat_interval_sec below inactive_timeout_sec (upstream's defaults: {HEARTBEAT_S} "
                    f"and {INACTIVE_TIMEOUT_S})")]


def lint_router_cluster(router: Mapping, *, source: str) -> list[Finding]:
    """The router's own disagg_cluster: an http:// URI must be the router's address, which serves the storage."""
    cluster = _cluster(router) or {}
    subject = f"{source}: disagg_cluster"
    uri = str(cluster.get("cluster_uri", ""))
    findings = _heartbeat(cluster, subject)
    parts = urlsplit(uri)
    if not uri:
        findings.append(Finding("disagg-cluster", "error", f"{subject}.cluster_uri", "unset (a required field)",
                                "set cluster_uri: http://<router host>:<router port>"))
    elif parts.scheme in ("http", "https") and parts.port != int(router.get("port", 8000)):
        findings.append(Finding("disagg-cluster", "error", f"{subject}.cluster_uri",
                                f"{uri} is not this router (port {router.get('port', 8000)}): with an http:// URI the "
                                f"router serves the cluster storage itself, so servers registering at {uri} are never "
                                f"seen", f"set cluster_uri to http://<router host>:{router.get('port', 8000)}"))
    minimal = cluster.get("minimal_instances") or {}
    for section in ("context_servers", "generation_servers"):
        if int(minimal.get(section, 1)) < 1:
            findings.append(Finding("disagg-cluster", "error", f"{subject}.minimal_instances.{section}",
                                    f"{minimal[section]}: the router reports ready with no {section} and fails "
                                    f"every request", "require at least 1 of each role"))
    return findings


def lint_worker_cluster(options: Mapping, router: Mapping, *, source: str) -> list[Finding]:
    """A server's disagg_cluster (its YAML) against the router's: the same name and URI, a live heartbeat."""
    mine, theirs = _cluster(options), _cluster(router)
    subject = f"{source}: disagg_cluster"
    if mine is None:
        return []                        # a static-url server, or a --disagg_cluster_uri alone (lint_launch_cluster)
    if theirs is None:
        return [Finding("disagg-cluster", "error", subject,
                        "the server registers with a disagg cluster but the router lists static urls and serves no "
                        "cluster storage", "give the router the same disagg_cluster, or drop it from the server")]
    findings = _heartbeat(mine, subject)
    name, router_name = mine.get("cluster_name", ""), theirs.get("cluster_name", "")
    if name != router_name:
        findings.append(Finding("disagg-cluster", "error", f"{subject}.cluster_name",
                                f"{name!r}, the router's is {router_name!r}: the server registers under "
                                f"/trtllm-disagg/{name}/workers, which the router does not watch",
                                f"set cluster_name: {router_name!r}"))
    if "cluster_uri" in mine and mine["cluster_uri"] != theirs.get("cluster_uri"):
        findings.append(Finding("disagg-cluster", "error", f"{subject}.cluster_uri",
                                f"{mine['cluster_uri']}, the router's is {theirs.get('cluster_uri')}; in 1.2.1 the "
                                f"YAML's URI also overrides --disagg_cluster_uri",
                                f"set cluster_uri: {theirs.get('cluster_uri')} (or drop it and pass the flag)"))
    return findings


def lint_launch_cluster(script: str, router: Mapping | None, *, source: str) -> list[Finding]:
    """Each --disagg_cluster_uri of a launch script is the router's cluster_uri."""
    uris = dict.fromkeys(re.findall(r"--disagg_cluster_uri[\s=]+(\S+)", script))
    expected = (_cluster(router or {}) or {}).get("cluster_uri")
    return [Finding("disagg-cluster", "error", f"{source}: --disagg_cluster_uri {uri}",
                    f"the router's cluster_uri is {expected or 'unset (static urls)'}: the server registers where the "
                    f"router does not look", f"pass --disagg_cluster_uri {expected or '<the router cluster_uri>'}")
            for uri in uris if uri != expected]

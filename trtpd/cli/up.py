"""`trtpd up`: render the reference repository and start the real tritonserver on 127.0.0.1."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from trtpd.cli import args as a
from trtpd.cli.common import add_reference_args, reference_spec


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="start a deployment (tritonserver with the rendered repository)",
                       description="Render the model repository for the reference backend and start tritonserver "
                                   "on 127.0.0.1; waits until it is ready and prints its endpoints.")
    p.add_argument("-f", "--file", dest="spec_file", metavar="SPEC.yaml",
                   help="a deployment spec (configs/deployments/*.yaml): start it under the controller, which heals, "
                        "scales (`trtpd scale`) and rolls out (`trtpd rollout`); every other option is in the spec")
    p.add_argument("--name", default="default", help="deployment name (default: %(default)s)")
    p.add_argument("--http-port", type=a.port, help="(default: a free port)")
    p.add_argument("--grpc-port", type=a.port, help="(default: a free port)")
    p.add_argument("--metrics-port", type=a.port, help="(default: a free port)")
    p.add_argument("--replace", action="store_true", help="stop a running deployment of the same name first")
    p.add_argument("--fleet", action="store_true",
                   help="one tritonserver per instance (own ports, state folder and cores) instead of one server, "
                        "behind an OpenAI-compatible gateway")
    p.add_argument("--gateway-port", type=a.port, default=0, help="--fleet: the gateway's port (default: a free one)")
    p.add_argument("--backend", choices=("triton", "trtllm-serve"), default="triton",
                   help="--fleet: each instance a tritonserver with its role model (default), or a trtllm-serve worker "
                        "(on the CPU: trtpd's twin of one, python -m trtpd.serve_twin) reached over trtllm-serve's "
                        "HTTP protocol")
    gpu = p.add_argument_group("--fleet --backend trtllm-serve on GPUs (docs/gpu-build.md)")
    gpu.add_argument("--gpus", metavar="IDS|auto",
                     help="the GPUs the workers may use, e.g. 0,1,2,3 (auto: those `nvidia-smi -L` lists): each "
                          "instance gets its own set of tp_size x pp_size of them as CUDA_VISIBLE_DEVICES and runs "
                          "the real trtllm-serve; without it the workers are the CPU twin")
    gpu.add_argument("--serve-dir", type=Path, metavar="DIR",
                     help="with --gpus: the deploy/serve-pytorch/ folder `trtpd build --model MODEL` wrote (the "
                          "checkpoint, each role's flags and --extra_llm_api_options; default: "
                          "<engines-dir>/<model>/deploy/serve-pytorch)")
    gpu.add_argument("--serve-command", metavar="CMD", default="trtllm-serve",
                     help="with --gpus: the program started with trtllm-serve's command line (default: %(default)s; "
                          "e.g. 'python -m trtpd.serve_twin' takes the same flags)")
    gpu.add_argument("--start-timeout", type=a.positive_float, metavar="S",
                     help="with --gpus: seconds a worker may take to load and answer /health (default: 900)")
    p.add_argument("--triton-entry", action="store_true",
                   help="--fleet: also a Triton server with the ensemble, routed across the instances like the gateway")
    auth = p.add_mutually_exclusive_group()
    auth.add_argument("--api-key-file", help="--fleet: the gateway requires one of the keys in this file (one per "
                                             "line, mode 0600; default: the deployment's api.key, made and printed "
                                             "on the first start)")
    auth.add_argument("--no-auth", action="store_true", help="--fleet: serve the OpenAI API without a key "
                                                             "(the gateway listens on 127.0.0.1 only)")
    add_reference_args(p)
    for role in ("prefill", "decode", "colocated"):   # short forms for --fleet; the same settings
        p.add_argument(f"--{role}", dest=f"{role}_instances", type=a.positive_int, default=argparse.SUPPRESS,
                       help=f"--fleet: {role} instance servers (= --{role}-instances)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trtpd.fleet import deployment
    from trtpd.fleet.tritonserver import ServerPorts

    if args.spec_file:
        return run_spec(args)
    if args.fleet:
        return run_fleet(args)
    if args.backend != "triton":
        raise a.ConfigError(f"--backend {args.backend} needs --fleet (one worker per instance, behind the gateway)")
    a.refuse_given(args, GPU_FLAGS, "needs --fleet --backend trtllm-serve (real trtllm-serve workers on GPUs)")
    if args.gateway_port or args.api_key_file or args.no_auth or args.triton_entry:
        raise a.ConfigError("--gateway-port, --api-key-file, --no-auth and --triton-entry need --fleet (the single "
                            "server has no gateway; its ensemble is the Triton entry)")
    from trtpd.fleet.records import is_fleet
    if is_fleet(args.name):
        raise a.ConfigError(f"{args.name!r} is a fleet; `trtpd down --name {args.name}` first, or choose another --name")
    spec = reference_spec(args)
    ports = None
    if args.http_port or args.grpc_port or args.metrics_port:
        picked = ServerPorts.pick()
        ports = ServerPorts(args.http_port or picked.http, args.grpc_port or picked.grpc,
                            args.metrics_port or picked.metrics)
    print(f"starting {args.mode} deployment {args.name!r} ...", flush=True)
    dep = deployment.up(args.name, spec, ports=ports, replace=args.replace)
    s = dep.server
    print(f"ready: {args.name} ({dep.mode}), pid {s.pid}")
    print(f"  HTTP     http://{s.http_url}   (POST /v2/models/ensemble/generate | generate_stream)")
    print(f"  gRPC     {s.grpc_url}")
    print(f"  metrics  {s.metrics_url}")
    print(f"  log      {s.log_path}")
    return 0


def run_fleet(args: argparse.Namespace) -> int:
    from trtpd.fleet.instance import shares_cores
    from trtpd.fleet.launcher import fleet_up

    a.refuse_given(args, ("http_port", "grpc_port", "metrics_port"), "not used by --fleet (each instance gets "
                                                                     "free ports of its own)")
    from trtpd.fleet.launcher import fleet_down
    from trtpd.fleet.gateway_process import attach_gateway
    mode = "colocated" if args.mode == "colocated" or "colocated_instances" in a.given(args) else "disaggregated"
    if mode == "colocated" and args.mode != "colocated" and "mode" in a.given(args):
        a.refuse_given(args, ("colocated_instances",), f"not used by --mode {args.mode}")
    spec = reference_spec(args, mode)
    starter, on_gpus = None, {}
    if args.backend == "trtllm-serve":
        a.refuse_given(args, ("triton_entry", "kv_transport"), "not used by --backend trtllm-serve (its workers "
                                                                "move KV as cache_transceiver_config says)")
        from trtpd.fleet.serve_workers import ServeStarter
        workers = gpu_workers(args, mode)
        starter = ServeStarter(spec, transceiver=None if workers else "default", gpus=workers)
        if workers is not None:
            from trtpd.fleet.gpus import parse_gpus
            on_gpus = {"gpu_ids": parse_gpus(args.gpus), "tokenizer_dir": workers.role("prefill").tokenizer_dir,
                       "gpus_per_role": {r: w.gpus_per_instance for r, w in workers.roles.items()},
                       "timeout_s": workers.start_timeout_s}
    else:
        a.refuse_given(args, GPU_FLAGS, "needs --backend trtllm-serve (real trtllm-serve workers on GPUs)")
    counts = ({"colocated": spec.colocated_instances} if mode == "colocated" else
              {"prefill": spec.prefill_instances, "decode": spec.decode_instances})
    print(f"starting {mode} fleet {args.name!r} ({', '.join(f'{n} {r}' for r, n in counts.items())}; "
          f"decode first{'; on GPUs ' + args.gpus if on_gpus else ''}) ...", flush=True)
    fleet = fleet_up(args.name, spec, replace=args.replace, triton_entry=args.triton_entry, starter=starter,
                     **counts, **on_gpus)
    try:
        attach_gateway(fleet, port=args.gateway_port, api_key_file=args.api_key_file, no_auth=args.no_auth)
    except BaseException:
        fleet_down(fleet.name)
        raise
    print(f"ready: {fleet.name} ({fleet.mode} fleet, {len(fleet.instances)} instances, key {fleet.key_file})")
    print_gateway(fleet.gateway)
    for i in fleet.instances:
        s = i.server
        if i.protocol == "trtllm-serve":
            gpus = f"  CUDA_VISIBLE_DEVICES={','.join(map(str, i.gpus))}" if i.gpus else ""
            print(f"  {i.name:<12} {i.role:<9} pid {s.pid}  trtllm-serve http://{i.http_url}/v1  log {s.log_path}  "
                  f"cpus {','.join(map(str, i.cpus))}{gpus}")
            continue
        print(f"  {i.name:<12} {i.role:<9} pid {s.pid}  gRPC {i.grpc_url}  HTTP http://{i.http_url}  "
              f"metrics {i.metrics_url}  KV {i.kv_advertise or '-'}  cpus {','.join(map(str, i.cpus))}")
    entry = next((i for i in fleet.instances if i.role == "entry"), None)
    if entry is not None:
        print(f"  Triton entry http://{entry.http_url}/v2/models/ensemble/generate_stream | gRPC {entry.grpc_url} "
              f"(the ensemble, routed across the instances)")
    if shares_cores([i.cpus for i in fleet.instances if i.role != "entry"]):
        print("  note: more instances than cores: instances share cores, so they slow each other down")
    return 0


GPU_FLAGS = ("gpus", "serve_dir", "serve_command", "start_timeout")


def gpu_workers(args: argparse.Namespace, mode: str):
    """The real workers `--gpus` asks for (None: the CPU twin)."""
    from trtpd.fleet.gpu_workers import load_gpu_workers
    from trtpd.trtllm.deploy import SERVE_PYTORCH_DIR

    if args.gpus is None:
        a.refuse_given(args, GPU_FLAGS, "needs --gpus (without it the workers are the CPU twin)")
        return None
    if mode != "disaggregated":
        raise a.ConfigError("--gpus: serve-pytorch/ renders context and generation workers; use --mode "
                            "disaggregated (--prefill N --decode M)")
    a.refuse_given(args, ("engines", "kv_dtype"), "not used with --gpus (the workers load the checkpoint "
                                                  "serve-pytorch/launch.sh names)")
    serve_dir = args.serve_dir or args.engines_dir / args.model / "deploy" / SERVE_PYTORCH_DIR
    command = shlex.split(args.serve_command)
    kwargs = {"start_timeout_s": args.start_timeout} if args.start_timeout else {}
    return load_gpu_workers(serve_dir, command, **kwargs)


def run_spec(args: argparse.Namespace) -> int:
    from pathlib import Path

    from trtpd.controller.daemon import bring_up

    extra = sorted(a.given(args) - {"spec_file", "func"})
    if extra:
        raise a.ConfigError(f"-f/--file takes every setting from the spec; drop {', '.join(a.flag(d) for d in extra)}")
    print(f"starting the deployment in {args.spec_file} under the controller ...", flush=True)
    up = bring_up(Path(args.spec_file))
    print(f"ready: {up['name']} revision {up['revision']} ({', '.join(up['instances'])})")
    if up.get("kubernetes"):
        k = up["kubernetes"]
        print(f"  OpenAI API   {k['gateway_url']}/v1   (the gateway pod, namespace {k['namespace']})")
        print(f"  API key      `kubectl -n {k['namespace']} get secret {k['api_key_secret']} "
              f"-o jsonpath={{.data.keys}} | base64 -d`")
    else:
        print_gateway(up["gateway"])
    scale = " ".join(f"{role}=N" for role in up["roles"])
    print(f"  controller   running; `trtpd scale {up['name']} {scale}`, `trtpd rollout SPEC.yaml`, "
          f"`trtpd history {up['name']}`, `trtpd down --name {up['name']}`")
    return 0


def print_gateway(gw: dict) -> None:
    print(f"  OpenAI API   http://{gw['host']}:{gw['port']}/v1   (gateway pid {gw['pid']}, restarted by supervisord "
          f"if it dies; /health, /metrics)")
    if gw.get("new_api_key"):
        print(f"  API key      {gw['new_api_key']}   (shown once; kept in {gw['api_key_file']}, mode 0600)")
    elif gw.get("api_key_file"):
        print(f"  API key      in {gw['api_key_file']} (send `Authorization: Bearer <key>`)")
    else:
        print("  API key      none (--no-auth: anyone on this host can use the API)")

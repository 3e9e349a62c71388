"""`python -m trtpd.serve_twin MODEL [trtllm-serve's flags]`: one trtllm-serve twin worker (see __init__.py)."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from contextlib import asynccontextmanager
from pathlib import Path

from trtpd.errors import ConfigError, TrtpdError

log = logging.getLogger("trtpd.serve_twin")


def engine_folder(model: Path, role: str) -> Path:
    """MODEL is a reference build (reference-<kv dtype>/, holding checkpoint/ and <role>-tp1/) or its checkpoint."""
    root = model.parent if (model / "config.json").is_file() and (model.parent / f"{role}-tp1").is_dir() else model
    folder = root / f"{role}-tp1"
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{model}: no {role} engine at {folder}; pass the folder `trtpd build --backend reference` "
                          f"wrote (reference-<kv dtype>) or its checkpoint/")
    return folder


def check_engine(opts, config) -> None:
    """The YAML's kv_cache_config must describe the engine the folder holds: a twin never runs another KV
    layout than it was asked for (a generation worker would pull KV it cannot read)."""
    if opts.kv_dtype is not None and opts.kv_dtype.lower() != config.kv_dtype.value:
        raise ConfigError(f"kv_cache_config.dtype {opts.kv_dtype!r} differs from the engine's KV dtype "
                          f"{config.kv_dtype.value!r}; build the reference engine with --kv-dtype {opts.kv_dtype}")
    if opts.tokens_per_block is not None and opts.tokens_per_block != config.tokens_per_block:
        raise ConfigError(f"kv_cache_config.tokens_per_block {opts.tokens_per_block} differs from the engine's "
                          f"{config.tokens_per_block}; build the reference engine with --tokens-per-block "
                          f"{opts.tokens_per_block}")


def build_worker(opts):
    from trtpd.engine.engine_config import EngineConfig, Role
    from trtpd.engine.loader import KvTransferOptions, load_engine
    from trtpd.serve_twin.app import TwinWorker
    from trtpd.serve_twin.engine_bridge import AsyncEngine
    from trtpd.serve_twin.options import NO_TIMEOUT_MS

    folder = engine_folder(opts.model, opts.role)
    check_engine(opts, EngineConfig.load(folder))
    key = None
    if opts.key_file is not None:
        from trtpd.kv.handle import load_or_create_key_file
        key = load_or_create_key_file(opts.key_file)
    kv = KvTransferOptions(transport=opts.kv_transport, key_file=opts.key_file, host=opts.kv_host,
                           timeout_ms=opts.kv_transfer_timeout_ms or NO_TIMEOUT_MS)
    loaded = load_engine(folder, kv, Role(opts.role))
    name = opts.served_model_name or loaded.config.model
    holder: list = []
    engine = AsyncEngine(loaded, name=f"twin-{opts.role}", on_output=lambda: holder[0].record_iteration(),
                         step_delay_s=opts.step_delay_ms / 1000.0)
    worker = TwinWorker(engine, name, opts.role, key, iter_stats=opts.iter_perf_stats,
                        perf_metrics_max_requests=opts.perf_metrics_max_requests)
    holder.append(worker)
    return worker


def main(argv: list[str] | None = None) -> int:
    from trtpd.serve_twin.options import parse_args

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)     # the cluster heartbeats: one line each
    try:
        opts = parse_args(sys.argv[1:] if argv is None else argv)
        for item in opts.ignored:
            log.info("%s: accepted as trtllm-serve's and ignored by the twin (it sizes GPUs or features the "
                     "reference engine has not)", item)
        worker = build_worker(opts)
    except TrtpdError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    serve(worker, opts)
    return 0


def serve(worker, opts) -> None:
    import uvicorn

    from trtpd.process_identity import write_state_file
    from trtpd.serve_twin.app import create_app
    from trtpd.serve_twin.cluster import ClusterWorker

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    host = "127.0.0.1" if opts.host == "localhost" else opts.host
    sock.bind((host, opts.port))
    port = sock.getsockname()[1]
    app = create_app(worker)
    token = None
    if worker.key is not None:
        from trtpd.kv.auth import cluster_token
        token = cluster_token(worker.key)
    membership = ClusterWorker(opts.cluster, opts.server_role, opts.host, port, token) if opts.cluster else None

    @asynccontextmanager
    async def lifespan(_app):
        if membership is not None:      # after the engine loaded, as upstream's lifespan does
            await membership.start()
        if opts.state_file is not None:
            write_state_file(opts.state_file, opts.host, port)
        try:
            yield
        finally:
            if membership is not None:
                await membership.stop()

    app.router.lifespan_context = lifespan
    log.info("trtllm-serve twin: %s (%s) on http://%s:%d", worker.model_name, opts.server_role or "context and "
             "generation", opts.host, port)
    try:
        uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3,
                                      log_config=None)).run(sockets=[sock])
    finally:
        worker.engine.close()


if __name__ == "__main__":
    sys.exit(main())

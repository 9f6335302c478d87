"""``python -m sglang.launch_server``: the HTTP server with the scheduler in its own process."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import uuid

import uvicorn

from sglang.srt.entrypoints.default_model import resolve_model_path
from sglang.srt.entrypoints.middleware import MAX_HEADER_BYTES, MAX_TARGET_BYTES
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger("sglang.launch_server")
FATAL_GRACE_S = 2.0


def parse_args(argv: list[str] | None = None) -> ServerArgs:
    parser = argparse.ArgumentParser(prog="python -m sglang.launch_server", description=__doc__)
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(argv))


def launch_server(args: ServerArgs) -> None:
    logging.basicConfig(
        level=args.log_level.upper(), format="[%(asctime)s] %(levelname)s %(name)s: %(message)s"
    )
    model_path = resolve_model_path(args.model_path)
    args = dataclasses.replace(args, model_path=model_path)
    logger.info(
        "server args: %s", {k: v for k, v in dataclasses.asdict(args).items() if k != "api_key"}
    )

    from sglang.srt.managers.compute_env import apply_compute_env_defaults
    from sglang.srt.managers.scheduler_process import run_scheduler_process
    from sglang.srt.model_executor.memory import InsufficientMemoryError, check_launch
    from sglang.srt.models.adapters import UnsupportedModelError, check_model

    if args.encoder_only:
        try:
            check_model(model_path, args.trust_remote_code)
        except UnsupportedModelError as exc:
            raise SystemExit(f"error: {exc}") from None
        apply_compute_env_defaults()
        _serve_encoder(args, model_path)
        return
    try:
        check_model(model_path, args.trust_remote_code)
        check_launch(args, model_path)  # before the scheduler starts loading weights
    except (UnsupportedModelError, InsufficientMemoryError) as exc:
        raise SystemExit(f"error: {exc}") from None

    ipc_dir = tempfile.mkdtemp(prefix="sglang-")
    tag = uuid.uuid4().hex[:8]
    to_scheduler = f"ipc://{ipc_dir}/to-scheduler-{tag}"
    from_scheduler = f"ipc://{ipc_dir}/from-scheduler-{tag}"
    apply_compute_env_defaults()
    ctx = mp.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=run_scheduler_process,
        args=(args, model_path, to_scheduler, from_scheduler, writer),
        daemon=True,
        name="sglang-scheduler",
    )
    proc.start()
    writer.close()  # only the child writes: a child that dies unannounced ends recv()
    try:
        ready = reader.recv()
    except EOFError:
        ready = RuntimeError(f"the scheduler process exited with code {proc.exitcode}")
    if isinstance(ready, Exception):
        proc.join(timeout=5)
        raise SystemExit(f"scheduler failed to start: {ready}")

    def stop_scheduler() -> None:
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()

    try:
        fatal = _serve(args, model_path, ready, (to_scheduler, from_scheduler), proc)
    finally:
        stop_scheduler()
    if fatal is not None:
        raise SystemExit(f"server stopped: {fatal}")


def _serve_encoder(args: ServerArgs, model_path: str) -> None:
    """An encoder-only worker: the vision tower behind POST /encode, in this process."""
    from sglang.srt.entrypoints.encode_server import create_encoder_app
    from sglang.srt.model_executor.encoder_runner import EncoderRunner

    try:
        runner = EncoderRunner(args, model_path)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    app = create_encoder_app(runner, args)
    logger.info("encoder-only worker on http://%s:%d", args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, http="h11")


def _serve(args: ServerArgs, model_path: str, ready, addrs: tuple[str, str], proc) -> str | None:
    """Serve until shutdown; return the fatal error that stopped the server, if any."""
    from sglang.srt.entrypoints.http_server import create_app
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    manager = TokenizerManager(args, model_path, ready, addrs, scheduler_proc=proc)
    app = create_app(manager, args, warm_up=True)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_keep_alive=5,
        # h11 (not httptools, should it be installed): a head arriving in several reads is
        # refused past this size; one that arrives whole meets HeaderLimitMiddleware.
        http="h11",
        h11_max_incomplete_event_size=MAX_HEADER_BYTES + MAX_TARGET_BYTES,
        timeout_graceful_shutdown=FATAL_GRACE_S,
    )
    server = uvicorn.Server(config)

    def on_fatal(message: str) -> None:
        # In-flight requests already have their error; give the responses a moment to leave.
        asyncio.get_running_loop().call_later(FATAL_GRACE_S, setattr, server, "should_exit", True)

    manager.on_fatal = on_fatal
    server.run()
    return manager.fatal_error


def main(argv: list[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    launch_server(parse_args(argv))


if __name__ == "__main__":
    main()

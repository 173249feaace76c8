"""``python -m trtfleet_engines.reference.serve``: run the reference engine with trtllm-serve's HTTP contract."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from aiohttp import web

from trtfleet_engines.reference.serve.app import ServeApp
from trtfleet_engines.reference.serve.settings import ServeSettings, SettingsError, settings_from_args

logger = logging.getLogger("trtfleet_engines.reference.serve")


async def serve(settings: ServeSettings, server: ServeApp) -> None:
    """Serve until SIGTERM or SIGINT; a client that disconnects cancels its handler (and its request)."""
    app = server.application()
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    await site.start()
    logger.info("serving %s on http://%s:%d", settings.served_model_name, settings.host, settings.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = settings_from_args(argv)
        server = ServeApp(settings)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:  # a model directory the numpy Llama cannot load
        print(f"error: cannot load the model: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(settings, server))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Runs an instant ChatStub in its own process and prints its base URL (benchmark helper)."""

from __future__ import annotations

import asyncio
import signal

from osmosis_ai.testing import ChatStub


async def main() -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with ChatStub() as stub:
        print(stub.base_url, flush=True)
        await stop.wait()


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())

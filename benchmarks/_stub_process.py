"""Runs an instant ChatStub in its own process and prints its base URL (benchmark helper).

``python _stub_process.py`` echoes; ``python _stub_process.py TOOL_TURNS`` answers a request
that offers tools with a call of its first tool until the conversation holds ``TOOL_TURNS``
tool results, then with text — so every agent rollout makes ``TOOL_TURNS + 1`` calls,
whatever the concurrency.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Any

from osmosis_ai.testing import ChatStub, StubReply


def _tool_rule(turns: int) -> Any:
    def respond(body: dict[str, Any]) -> StubReply:
        tools = body.get("tools") or []
        done = sum(1 for m in body.get("messages") or [] if m.get("role") == "tool")
        if not tools or done >= turns:
            return StubReply(content="done")
        name = tools[0]["function"]["name"]
        call = {"id": f"call_{done}", "type": "function",
                "function": {"name": name, "arguments": json.dumps({"n": done})}}  # fmt: skip
        return StubReply(tool_calls=[call])

    return respond


async def main() -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    respond = _tool_rule(int(sys.argv[1])) if len(sys.argv) > 1 else None
    async with ChatStub(respond=respond) as stub:
        print(stub.base_url, flush=True)
        await stop.wait()


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())

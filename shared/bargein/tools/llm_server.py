"""An OpenAI-compatible chat server that answers as the scripted model does, for the benches.

A stack on the scripted model (the benches' default) never makes an HTTP request for an answer, so
it never pays what a deployment on a real model pays: the LLM client's set-up, a streamed HTTP
response per turn, its parsing. Building one client per session cost each session start 30 ms of
CPU that way, unseen by every bench (``bench scale --llm server`` shows it now). This server streams
:class:`~bargein.agent.llm.ScriptedLLM`'s replies, at its pace (``BARGEIN_SCRIPTED_*``), as chat
completion chunks, so the stack's processes do what they would against vLLM or OpenAI while the
answers and their timing stay those of the scripted model.

``python -m bargein.tools.llm_server --port N`` serves ``http://127.0.0.1:N/v1`` until stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import AsyncIterator, Sequence

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bargein.agent.llm import ScriptedLLM
from bargein.settings import LLMSettings, load

READY = "llm server ready on"  # the line a bench waits for: "llm server ready on http://.../v1"


def chat_app(llm: ScriptedLLM) -> Starlette:
    """``POST /v1/chat/completions`` with ``stream: true``: ``llm``'s reply to the messages;
    ``GET /stats``: how many it answered (a bench shows its stack really asked it)."""
    answered = 0

    async def stats(request: Request) -> Response:
        return JSONResponse({"answered": answered})

    async def chat(request: Request) -> Response:
        nonlocal answered
        try:
            body = json.loads(await request.body())
            messages = body["messages"]
            if not isinstance(messages, list):
                raise TypeError("messages must be a list")
        except (ValueError, KeyError, TypeError) as exc:
            return JSONResponse({"error": {"message": f"bad request: {exc}"}}, status_code=400)
        model = str(body.get("model", "scripted"))
        answered += 1

        def event(delta: dict[str, str], finish: str | None = None) -> str:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            chunk = {"id": "scripted", "object": "chat.completion.chunk", "created": 0, "model": model}
            return f"data: {json.dumps({**chunk, 'choices': [choice]})}\n\n"

        async def events() -> AsyncIterator[str]:
            yield event({"role": "assistant", "content": ""})
            async for chunk in llm.generate_stream(messages):
                yield event({"content": chunk.text})
            yield event({}, finish="stop")
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/stats", stats, methods=["GET"]),
        ]
    )


async def serve(host: str, port: int) -> None:
    llm = ScriptedLLM.from_settings(load(LLMSettings))
    server = uvicorn.Server(uvicorn.Config(chat_app(llm), host=host, port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # the reason it could not start
            return
        await asyncio.sleep(0.02)
    print(f"{READY} http://{host}:{port}/v1", flush=True)
    await task


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bargein.tools.llm_server", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    options = parser.parse_args(argv)
    asyncio.run(serve(options.host, options.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())

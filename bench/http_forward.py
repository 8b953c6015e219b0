"""The collector's bare baseline: an HTTP endpoint that forwards a body's lines to Kafka and answers after the acks.

``bench/ingest_bench.py`` starts it as its own process (``python bench/http_forward.py PORT TOPIC``) and posts it
the same requests as ``trends collect``, from the same clients. It has what every durable HTTP ingest needs -- the
same server (uvicorn, FastAPI), an idempotent producer with the collector's settings, a delivery report per record,
the answer only once Kafka acknowledged every line -- and nothing of the collector's own work: no token, limits,
parsing, validation, pseudonyms or metrics. The lines go as they are, unkeyed.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any

import uvicorn
from confluent_kafka import KafkaError, Message, Producer
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from infra.settings import Settings
from ingestion.producer import producer_config


def create_app(topic: str) -> FastAPI:
    """Return the forwarding app: one producer, polled on a thread of its own."""
    producer = Producer(producer_config(Settings()))

    def poll() -> None:  # serves the delivery reports for as long as the process lives
        while True:
            producer.poll(0.05)

    app = FastAPI()
    threading.Thread(target=poll, daemon=True).start()

    @app.post("/api/v1/events")
    async def forward(request: Request) -> JSONResponse:
        lines = [line for line in (await request.body()).split(b"\n") if line]
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        left = [len(lines)]
        errors: list[str] = []
        lock = threading.Lock()

        def acked(err: KafkaError | None, _msg: Message) -> None:
            with lock:
                if err is not None:
                    errors.append(err.str())
                left[0] -= 1
                if left[0] == 0:
                    loop.call_soon_threadsafe(done.set_result, None)

        for line in lines:
            while True:
                try:
                    producer.produce(topic, line, on_delivery=acked)
                    break
                except BufferError:
                    await asyncio.sleep(0.01)
        if lines:
            await done
        if errors:
            return JSONResponse({"detail": errors[:3]}, status_code=503)
        return JSONResponse({"accepted": len(lines), "rejected": []})

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok"}

    return app


if __name__ == "__main__":
    port, topic = int(sys.argv[1]), sys.argv[2]
    uvicorn.run(create_app(topic), host="127.0.0.1", port=port, log_level="warning", access_log=False)

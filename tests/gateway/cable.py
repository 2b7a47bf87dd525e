"""A TCP relay between kcoord and an upstream broker that a test can cut and restore: cut closes its
listener and resets every connection through it (what a crashed broker looks like from kcoord: resets,
then refused connections), restore listens on the same port again; ``stalled`` holds every byte (a
broker that hangs). The broker advertises the cable's
port, so kcoord only ever reaches it through the cable; its data survives the cut."""

import asyncio
import contextlib
import threading

from tests.kcoord_process import free_port


class Cable:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.stalled = False  # a broker that accepts and reads nothing: bytes wait in the cable
        self._closed = False
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def _call(self, coro: "asyncio.Future[None] | object") -> None:
        asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)  # type: ignore[arg-type]

    def restore(self) -> None:
        self._call(self._listen())

    def cut(self) -> None:
        self._call(self._cut())

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                while self.stalled:
                    await asyncio.sleep(0.05)
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.transport.abort()

    def close(self) -> None:
        """Cuts every connection and stops the cable's loop; again, nothing (a test and its fixture both)."""
        if self._closed:
            return
        self._closed = True
        self.cut()
        self.loop.call_soon_threadsafe(self.loop.stop)

"""Server-sent events over a chunked HTTP/1.1 body, read as they arrive: Triton's
`generate_stream` sends each response as one `data: {json}` event and ends the body with the
last (transport/http_door.py hands each event to the engine as one streamed response)."""

from __future__ import annotations


class SseReader:
    """Incremental: `feed` bytes of the body (after the head), get the whole events so far;
    `ended` once the terminating chunk arrived."""

    __slots__ = ("raw", "left", "text", "ended")

    def __init__(self) -> None:
        self.raw = b""  # chunked bytes not yet decoded
        self.left = -1  # bytes of the current chunk still due (-1: a size line is next)
        self.text = b""  # decoded body not yet split into events
        self.ended = False

    def feed(self, data: bytes) -> list[bytes]:
        raw = self.raw + data if self.raw else data
        while not self.ended:
            if self.left < 0:
                eol = raw.find(b"\r\n")
                if eol < 0:
                    break
                size = int(raw[:eol].split(b";")[0], 16)
                if size == 0:  # the last chunk: ended once its closing CRLF is in too
                    if len(raw) < eol + 4:
                        break
                    self.ended = True
                    raw = raw[eol + 4:]
                    break
                raw = raw[eol + 2:]
                self.left = size
            if len(raw) < self.left + 2:
                break
            self.text += raw[:self.left]
            raw = raw[self.left + 2:]
            self.left = -1
        self.raw = raw
        return self._events()

    def _events(self) -> list[bytes]:
        out = []
        while True:
            end = self.text.find(b"\n\n")
            if end < 0:
                break
            block, self.text = self.text[:end], self.text[end + 2:]
            data = [line[5:].lstrip(b" ") for line in block.split(b"\n")
                    if line.startswith(b"data:")]
            if data:
                out.append(b"\n".join(data))
        return out

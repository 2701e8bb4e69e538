"""What a real client (Python websockets) sees when the queue ends a connection.

Usage: close_codes.py ADDRESS. Prints one JSON line per case; the Rust test checks them.
"""
import asyncio
import json
import sys

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

ADDRESS = sys.argv[1]
PUBLISHER = {"username": "PUBLISHER-NAME", "password": "PUBLISHER-PASSWORD",
             "role": "publisher", "queuetype": "distribute"}
SUBSCRIBER = {"username": "SUBSCRIBER-NAME", "password": "SUBSCRIBER-PASSWORD",
              "role": "subscriber", "queuetype": "distribute", "capacity": 1}


async def ending(frames):
    """Sends each frame, waiting for its reply; returns the replies and the close code."""
    replies = []
    async with connect(ADDRESS) as socket:
        for frame in frames:
            await socket.send(frame)
            try:
                replies.append(json.loads(await socket.recv()))
            except ConnectionClosed as closed:
                return replies, (closed.rcvd.code if closed.rcvd else 1006)
        try:
            await asyncio.wait_for(socket.recv(), 10)
        except ConnectionClosed as closed:
            return replies, (closed.rcvd.code if closed.rcvd else 1006)
    return replies, None


async def raw_frame_case(name, write):
    """Logs in, then lets `write` put something on the wire; returns the close code seen."""
    async with connect(ADDRESS) as socket:
        await socket.send(json.dumps(PUBLISHER))
        await socket.recv()
        await write(socket)
        try:
            await asyncio.wait_for(socket.recv(), 10)
        except ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd else 1006
    return None


def masked(first_byte, payload):
    """A client frame written below the library: FIN and opcode in `first_byte`, masked."""
    mask = b"\x12\x34\x56\x78"
    return bytes([first_byte, 0x80 | len(payload)]) + mask + bytes(
        b ^ mask[i % 4] for i, b in enumerate(payload))


async def unfinished(socket):
    async def fragments():
        yield '{"body":'
        await asyncio.sleep(30)  # never finished: the node closes first
        yield '"late"}'
    asyncio.ensure_future(socket.send(fragments()))


async def main():
    raw = {
        "invalid_utf8": lambda s: s.send(b"\xc3\x28", text=True),
        "reserved_opcode": lambda s: asyncio.sleep(0, s.transport.write(masked(0x83, b"x"))),
        "broken_deflate": lambda s: asyncio.sleep(0, s.transport.write(masked(0xC1, b"\xff" * 8))),
        "unfinished": unfinished,
    }
    for name, write in raw.items():
        code = await raw_frame_case(name, write)
        print(json.dumps({"case": name, "code": code}), flush=True)
    cases = {
        "failed_login": [json.dumps({**SUBSCRIBER, "password": "wrong"})],
        "logout": [json.dumps(SUBSCRIBER), json.dumps({"logout": True})],
        "not_json": [json.dumps(SUBSCRIBER), "hello"],
        "too_big": [json.dumps(SUBSCRIBER), json.dumps({"capacity": 1, "pad": "x" * 70000})],
    }
    async with connect(ADDRESS) as socket:
        deflate = [str(e.name) for e in socket.protocol.extensions]
    print(json.dumps({"case": "extensions", "extensions": deflate}), flush=True)
    for name, frames in cases.items():
        replies, code = await ending(frames)
        print(json.dumps({"case": name, "replies": replies, "code": code}), flush=True)


asyncio.run(main())

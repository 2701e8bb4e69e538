"""What a real client (Python websockets) sees when the queue ends a connection.

Usage: close_codes.py ADDRESS. Prints one JSON line per case; the Rust test checks them.
"""
import asyncio
import json
import sys

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

ADDRESS = sys.argv[1]
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


async def main():
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

"""A real client (Python websockets, permessage-deflate on) against a backlog bigger than the
queue's write queue: a publisher sends COUNT messages of SIZE characters, then a subscriber
with room for all of them logs in and reads as fast as it can.

Usage: backlog.py ADDRESS COUNT SIZE. Prints one JSON line; the Rust test checks it.
"""
import asyncio
import json
import random
import string
import sys

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

ADDRESS, COUNT, SIZE = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
LOGIN = {"username": "PUBLISHER-NAME", "password": "PUBLISHER-PASSWORD",
         "role": "publisher", "queuetype": "distribute"}
SUBSCRIBE = {"username": "SUBSCRIBER-NAME", "password": "SUBSCRIBER-PASSWORD",
             "role": "subscriber", "queuetype": "distribute", "capacity": COUNT}


async def main():
    # Text that deflate shrinks only somewhat, so the frames on the wire stay big too.
    rng = random.Random(7)
    bodies = [f"{n:04} " + "".join(rng.choices(string.ascii_letters, k=SIZE))
              for n in range(COUNT)]
    async with connect(ADDRESS, max_size=None) as publisher:
        await publisher.send(json.dumps(LOGIN))
        assert json.loads(await publisher.recv())["status"] == "Success."
        for body in bodies:
            await publisher.send(json.dumps({"body": body}))
            reply = json.loads(await publisher.recv())
            assert reply["status"] == "Success.", reply
    received = []
    closed = None
    async with connect(ADDRESS, max_size=None) as subscriber:
        extensions = [str(e.name) for e in subscriber.protocol.extensions]
        await subscriber.send(json.dumps(SUBSCRIBE))
        assert json.loads(await subscriber.recv())["status"] == "Success."
        try:
            while len(received) < COUNT:
                frame = json.loads(await asyncio.wait_for(subscriber.recv(), 30))
                received.append(frame["body"])
        except ConnectionClosed as error:
            closed = error.rcvd.code if error.rcvd else 1006
    print(json.dumps({
        "extensions": extensions,
        "received": len(received),
        "whole_and_in_order": received == bodies,
        "closed": closed,
    }), flush=True)


asyncio.run(main())

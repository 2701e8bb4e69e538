"""A real client (Python websockets) that holds messages on a node, leaves without a logout,
and resumes its session later, on whatever node then serves the queue (a node started on the
first one's standby's copy, in the Rust test).

Usage: resume.py hold ADDRESS COUNT: logs in with capacity COUNT, reads COUNT messages and
           leaves holding them; prints {"session": ..., "bodies": [...]}.
       resume.py resume ADDRESS SESSION COUNT: resumes SESSION with "replay": true, reads COUNT
           messages and acks each; prints {"resumed": ..., "bodies": [...], "acks": [...]}.
"""
import asyncio
import json
import sys

from websockets.asyncio.client import connect

LOGIN = {"username": "SUBSCRIBER-NAME", "password": "SUBSCRIBER-PASSWORD",
         "role": "subscriber", "queuetype": "distribute"}


async def messages(socket, count):
    """The next COUNT deliveries (frames with a body), skipping anything else."""
    got = []
    while len(got) < count:
        frame = json.loads(await asyncio.wait_for(socket.recv(), 30))
        if "body" in frame:
            got.append(frame)
    return got


async def reply_to_ack(socket):
    """The next reply's status (a delivery that room made for may come before it)."""
    while True:
        frame = json.loads(await asyncio.wait_for(socket.recv(), 30))
        if "status" in frame:
            return frame["status"]


async def hold(address, count):
    async with connect(address) as socket:
        await socket.send(json.dumps({**LOGIN, "capacity": count}))
        reply = json.loads(await socket.recv())
        assert reply["status"] == "Success.", reply
        held = await messages(socket, count)
    return {"session": reply["sessionid"], "bodies": [m["body"] for m in held]}


async def resume(address, session, count):
    async with connect(address) as socket:
        await socket.send(json.dumps({**LOGIN, "sessionid": session, "replay": True}))
        reply = json.loads(await socket.recv())
        if reply["status"] != "Success.":
            return {"resumed": reply}
        held = await messages(socket, count)
        acks = []
        for message in held:
            await socket.send(json.dumps({"id": message["id"], "ack": 1}))
            acks.append(await reply_to_ack(socket))
        await socket.send(json.dumps({"logout": True}))
    return {"resumed": reply["status"], "bodies": [m["body"] for m in held], "acks": acks}


if __name__ == "__main__":
    if sys.argv[1] == "hold":
        result = asyncio.run(hold(sys.argv[2], int(sys.argv[3])))
    else:
        result = asyncio.run(resume(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    print(json.dumps(result))

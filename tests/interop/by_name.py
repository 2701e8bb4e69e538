"""Python `websockets` reaches a queue by its name over wss://, the way `controlplane dev`
says to: the TCP connection goes to an address our DNS gave, while TLS checks the certificate
for the queue's name against the given root.

Usage: by_name.py DEMO_JSON ADDRESS. Prints what the subscriber receives.
"""
import asyncio
import json
import ssl
import sys

from websockets.asyncio.client import connect

DEMO = json.load(open(sys.argv[1]))
ADDRESS = sys.argv[2]


def login(role, **extra):
    login = DEMO["logins"][role]
    return json.dumps({"username": login["username"], "password": login["password"],
                       "role": role, "queuetype": "distribute", **extra})


async def main():
    ctx = ssl.create_default_context(cafile=DEMO["trust"])
    # `host` moves only the TCP destination: the URL's name is still the TLS server name.
    async with connect(DEMO["node"], ssl=ctx, host=ADDRESS) as subscriber, \
            connect(DEMO["node"], ssl=ctx, host=ADDRESS) as publisher:
        await subscriber.send(login("subscriber", capacity=1))
        assert json.loads(await subscriber.recv())["status"] == "Success."
        await publisher.send(login("publisher"))
        assert json.loads(await publisher.recv())["status"] == "Success."
        await publisher.send(json.dumps({"body": f"by name, to {ADDRESS}"}))
        assert json.loads(await publisher.recv())["status"] == "Success."
        delivery = json.loads(await subscriber.recv())
        await subscriber.send(json.dumps({"id": delivery["id"], "ack": 1}))
        assert json.loads(await subscriber.recv())["status"] == "Success."
        print(delivery["body"])


asyncio.run(main())

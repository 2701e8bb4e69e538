"""Python `websockets` over wss:// against a node with a test CA.

Usage: tls_check.py URL CAFILE. Prints one JSON line per case; the Rust test checks them.
"""
import asyncio
import json
import ssl
import sys

from websockets.asyncio.client import connect

URL, CAFILE = sys.argv[1], sys.argv[2]
PUBLISHER = {"username": "PUBLISHER-NAME", "password": "PUBLISHER-PASSWORD",
             "role": "publisher", "queuetype": "distribute"}


def context(maximum=None):
    ctx = ssl.create_default_context(cafile=CAFILE)
    if maximum is not None:
        # Let this client offer old protocols, so a refusal is the server's.
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
        ctx.minimum_version = ssl.TLSVersion.TLSv1
        ctx.maximum_version = maximum
    return ctx


async def publish(ctx):
    async with connect(URL, ssl=ctx) as socket:
        await socket.send(json.dumps({**PUBLISHER, "body": "over TLS"}))
        reply = json.loads(await socket.recv())
        return reply, socket.protocol.extensions and socket.protocol.extensions[0].name


async def main():
    reply, extension = await publish(context())
    print(json.dumps({"case": "tls", "reply": reply, "extension": extension}), flush=True)
    reply, _ = await publish(context(ssl.TLSVersion.TLSv1_2))
    print(json.dumps({"case": "tls12", "reply": reply}), flush=True)
    try:
        await publish(context(ssl.TLSVersion.TLSv1_1))
        outcome = "accepted"
    except (ssl.SSLError, OSError) as error:
        outcome = "refused: " + type(error).__name__
    print(json.dumps({"case": "tls11", "outcome": outcome}), flush=True)


asyncio.run(main())

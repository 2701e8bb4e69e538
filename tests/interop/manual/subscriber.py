import asyncio
import json
from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

ADDRESS = "wss://QUEUE-ID.q.CLUSTER.thequeueexpert.com/"
LOGIN = {
    "username": "SUBSCRIBER-NAME",
    "password": "SUBSCRIBER-PASSWORD",
    "role": "subscriber",
    "queuetype": "distribute",
    "capacity": 10,
}

async def main():
    try:
        async with connect(ADDRESS) as socket:
            await socket.send(json.dumps(LOGIN))
            async for text in socket:
                frame = json.loads(text)
                if "body" in frame:
                    print("Received:", frame["body"], flush=True)
                    await socket.send(json.dumps({"id": frame["id"], "ack": 1}))
                elif frame.get("status") == "Failure.":
                    print("Failed:", frame["code"], frame["reason"], flush=True)
    except (OSError, WebSocketException) as error:
        print("Connection error:", error, flush=True)

asyncio.run(main())

import asyncio
import json
from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

ADDRESS = "wss://QUEUE-ID.q.CLUSTER.thequeueexpert.com/"
LOGIN = {
    "username": "ADMIN-NAME",
    "password": "ADMIN-PASSWORD",
    "role": "admin",
    "queuetype": "distribute",
}

async def main():
    try:
        async with connect(ADDRESS) as socket:
            await socket.send(json.dumps(LOGIN))
            reply = json.loads(await socket.recv())
            if reply["status"] != "Success.":
                print("Failed:", reply["code"], reply["reason"])
            else:
                await socket.send(json.dumps({"cmd": "getlivestats"}))
                reply = json.loads(await socket.recv())
                print("Messages in the queue:", reply["csv"].split(",")[0])
    except (OSError, WebSocketException) as error:
        print("Connection error:", error)

asyncio.run(main())

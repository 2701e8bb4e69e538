import WebSocket from "ws";

const address = "wss://QUEUE-ID.q.CLUSTER.thequeueexpert.com/";
const login = {
  username: "SUBSCRIBER-NAME",
  password: "SUBSCRIBER-PASSWORD",
  role: "subscriber",
  queuetype: "distribute",
  capacity: 10,
};

const socket = new WebSocket(address);

socket.on("open", () => socket.send(JSON.stringify(login)));
socket.on("error", (error) => console.log("Connection error:", error.code || error.message));
socket.on("message", (data) => {
  const frame = JSON.parse(data);
  if (frame.body !== undefined) {
    console.log("Received:", frame.body);
    socket.send(JSON.stringify({ id: frame.id, ack: 1 }));
  } else if (frame.status === "Failure.") {
    console.log("Failed:", frame.code, frame.reason);
  }
});

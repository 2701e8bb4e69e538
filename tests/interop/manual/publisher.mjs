import WebSocket from "ws";

const address = "wss://QUEUE-ID.q.CLUSTER.thequeueexpert.com/";
const login = {
  username: "PUBLISHER-NAME",
  password: "PUBLISHER-PASSWORD",
  role: "publisher",
  queuetype: "distribute",
};

const socket = new WebSocket(address);
let loggedIn = false;

socket.on("open", () => socket.send(JSON.stringify(login)));
socket.on("error", (error) => console.log("Connection error:", error.code || error.message));
socket.on("message", (data) => {
  const reply = JSON.parse(data);
  if (reply.status !== "Success.") {
    console.log("Failed:", reply.code, reply.reason);
    socket.close();
  } else if (!loggedIn) {
    loggedIn = true;
    socket.send(JSON.stringify({ body: "Hello from Node.js" }));
  } else {
    console.log("Published. The message id is", reply.id);
    socket.close();
  }
});

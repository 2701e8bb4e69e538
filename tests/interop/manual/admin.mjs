import WebSocket from "ws";

const address = "wss://QUEUE-ID.q.CLUSTER.thequeueexpert.com/";
const login = {
  username: "ADMIN-NAME",
  password: "ADMIN-PASSWORD",
  role: "admin",
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
    socket.send(JSON.stringify({ cmd: "getlivestats" }));
  } else {
    console.log("Messages in the queue:", reply.csv.split(",")[0]);
    socket.close();
  }
});

// What Node's ws package sees when the queue ends a connection.
// Usage: node close_codes.mjs ADDRESS. Prints one JSON line per case.
import WebSocket from "ws";

const address = process.argv[2];
const subscriber = {
  username: "SUBSCRIBER-NAME", password: "SUBSCRIBER-PASSWORD",
  role: "subscriber", queuetype: "distribute", capacity: 1,
};

function ending(frames) {
  return new Promise((resolve) => {
    const socket = new WebSocket(address);
    const replies = [];
    let next = 0;
    const sendNext = () => { if (next < frames.length) socket.send(frames[next++]); };
    socket.on("open", sendNext);
    socket.on("message", (data) => { replies.push(JSON.parse(data)); sendNext(); });
    socket.on("error", () => {});
    socket.on("close", (code) => resolve({ replies, code, deflate: !!socket.extensions }));
  });
}

const cases = {
  failed_login: [JSON.stringify({ ...subscriber, password: "wrong" })],
  logout: [JSON.stringify(subscriber), JSON.stringify({ logout: true })],
  not_json: [JSON.stringify(subscriber), "hello"],
  too_big: [JSON.stringify(subscriber), JSON.stringify({ capacity: 1, pad: "x".repeat(70000) })],
};
for (const [name, frames] of Object.entries(cases)) {
  const result = await ending(frames);
  console.log(JSON.stringify({ case: name, ...result }));
}

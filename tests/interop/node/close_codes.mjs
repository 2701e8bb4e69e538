// What Node's ws package sees when the queue ends a connection.
// Usage: node close_codes.mjs ADDRESS. Prints one JSON line per case.
import WebSocket from "ws";

const address = process.argv[2];
const publisher = {
  username: "PUBLISHER-NAME", password: "PUBLISHER-PASSWORD",
  role: "publisher", queuetype: "distribute",
};
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

// Frames the library sends as asked (text that is not UTF-8, an unfinished fragmented message)
// or that are written below it (a reserved opcode, a broken compressed frame).
function masked(firstByte, payload) {
  const mask = Buffer.from([0x12, 0x34, 0x56, 0x78]);
  const body = Buffer.from(payload.map((b, i) => b ^ mask[i % 4]));
  return Buffer.concat([Buffer.from([firstByte, 0x80 | payload.length]), mask, body]);
}

function rawCase(write) {
  return new Promise((resolve) => {
    const socket = new WebSocket(address);
    socket.on("open", () => socket.send(JSON.stringify(publisher)));
    socket.once("message", () => write(socket));
    socket.on("error", () => {});
    socket.on("close", (code) => resolve(code));
  });
}

const raw = {
  invalid_utf8: (s) => s.send(Buffer.from([0xc3, 0x28]), { binary: false }),
  reserved_opcode: (s) => s._socket.write(masked(0x83, [0x78])),
  broken_deflate: (s) => s._socket.write(masked(0xc1, [255, 255, 255, 255, 255, 255, 255, 255])),
  unfinished: (s) => s.send('{"body":', { fin: false }),
};
for (const [name, write] of Object.entries(raw)) {
  const code = await rawCase(write);
  console.log(JSON.stringify({ case: name, code }));
}

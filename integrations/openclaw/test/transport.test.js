// How the plugin reaches the daemon over TCP, and what it never does there: send its token on a connection
// other than the one that proved the server holds it, read an unproven answer, or name a weak token; and how
// it finds the socket and the local token once, using them again only while they are the same files.
import assert from "node:assert/strict";
import fs, { chmodSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { syncBuiltinESMExports } from "node:module";
import net from "node:net";
import { join } from "node:path";
import { mock, test } from "node:test";

import { VeritasClient } from "../src/client.js";
import { resolveConfig } from "../src/config.js";
import { serverProof } from "../src/transport.js";
import { failure, fakeDaemon, homeWithDataDir, privateDir } from "./helpers.js";

const TOKEN = "transport-test-token-0123456789abcdefghij";

/** Raw HTTP/1.1 requests off a socket, one at a time: `next()` resolves with `{head, headers, body}`. */
function requestsOf(socket) {
  let buffer = Buffer.alloc(0);
  const waiting = [];
  const parse = () => {
    while (waiting.length) {
      const end = buffer.indexOf("\r\n\r\n");
      if (end < 0) return;
      const head = buffer.subarray(0, end).toString("latin1");
      const headers = Object.fromEntries(head.split("\r\n").slice(1).map((line) => {
        const at = line.indexOf(":");
        return [line.slice(0, at).trim().toLowerCase(), line.slice(at + 1).trim()];
      }));
      const length = Number(headers["content-length"] ?? 0);
      if (buffer.length < end + 4 + length) return;
      const body = buffer.subarray(end + 4, end + 4 + length).toString("utf8");
      buffer = buffer.subarray(end + 4 + length);
      waiting.shift()({ head, headers, body });
    }
  };
  socket.on("data", (chunk) => {
    buffer = Buffer.concat([buffer, chunk]);
    parse();
  });
  return () => new Promise((resolve) => {
    waiting.push(resolve);
    parse();
  });
}

function answer(socket, status, headers, body = "") {
  const lines = [`HTTP/1.1 ${status} X`, ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`)];
  socket.write(`${lines.join("\r\n")}\r\n\r\n${body}`);
}

test("the token goes on the connection that proved the server holds it: a squatter taking the port in between " +
  "gets nothing", async () => {
  // The daemon's part, on demand: it proves it holds the token, but first gives its port away (stopping), and
  // another process binds it in that instant. A new connection would reach that process.
  let squatter;
  const onProvenConnection = [];
  const server = net.createServer(async (socket) => {
    const next = requestsOf(socket);
    const health = await next();
    const port = server.address().port;
    server.close(); // listens no more (its callback waits for this connection to end)
    squatter = await fakeDaemon(() => ({ json: { context: "I am your memory", results: [] } }), { port });
    const json = JSON.stringify({ status: "ok" });
    answer(socket, 200, { "Content-Type": "application/json", "Content-Length": json.length,
      "X-Veritas-Proof": serverProof(TOKEN, health.headers["x-veritas-challenge"]) }, json);
    const request = await next();
    onProvenConnection.push(request);
    const reply = JSON.stringify({ results: [{ text: "the real memory" }], count: 1 });
    answer(socket, 200, { "Content-Type": "application/json", "Content-Length": reply.length,
      Connection: "close" }, reply);
    socket.end();
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${server.address().port}`;
  try {
    const c = new VeritasClient(resolveConfig({ url, token: TOKEN }).config, { env: {}, home: "/nonexistent" });
    const got = await c.post("/memory/search", { query: "my secret question" }, { agentId: "main" });
    assert.deepEqual(got, { results: [{ text: "the real memory" }], count: 1 });
    assert.ok(squatter, "the stand-in never gave its port away");
    assert.deepEqual(squatter.seen, []);
    assert.equal(onProvenConnection.length, 1);
    assert.match(onProvenConnection[0].head, /^POST \/memory\/search /);
    assert.equal(onProvenConnection[0].headers.authorization, `Bearer ${TOKEN}`);
  } finally {
    await squatter?.close();
  }
});

test("an unproven /health answer is not read: an endless body is refused at its headers", async () => {
  let written = 0;
  let dropped;
  const dropPromise = new Promise((resolve) => (dropped = resolve));
  const squatter = net.createServer(async (socket) => {
    await requestsOf(socket)();
    answer(socket, 200, { "Content-Type": "application/json", "Transfer-Encoding": "chunked" });
    const chunk = Buffer.alloc(65536, "a");
    const timer = setInterval(() => {
      socket.write(`${chunk.length.toString(16)}\r\n`);
      socket.write(chunk);
      socket.write("\r\n");
      written += chunk.length;
    }, 5);
    socket.on("close", () => {
      clearInterval(timer);
      dropped();
    });
    socket.on("error", () => {});
  });
  await new Promise((resolve) => squatter.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${squatter.address().port}`;
  try {
    const c = new VeritasClient(resolveConfig({ url, token: TOKEN, timeoutMs: 10000 }).config,
      { env: {}, home: "/nonexistent" });
    const started = Date.now();
    const error = await failure(c.post("/memory/context", { query: "q" }, { agentId: "main" }));
    assert.equal(error.kind, "untrusted", error.message); // before: read until the timeout, then "timeout"
    assert.ok(Date.now() - started < 5000, `took ${Date.now() - started} ms`);
    await dropPromise; // the plugin dropped the connection
  } finally {
    await new Promise((resolve) => squatter.close(resolve));
  }
  assert.ok(written < 64 * 1024 * 1024, `${written} bytes written`);
});

test("a proven server's /health is read up to 64 KB: a longer one is a bad answer, and nothing is sent", async () => {
  const daemon = await fakeDaemon(() => ({ json: {} }), { tokens: [TOKEN], healthBody: "x".repeat(200_000) });
  try {
    const c = new VeritasClient(resolveConfig({ url: daemon.url, token: TOKEN }).config,
      { env: {}, home: "/nonexistent" });
    const error = await failure(c.post("/memory/search", { query: "q" }, { agentId: "main" }));
    assert.equal(error.kind, "bad_answer", error.message);
    assert.deepEqual(daemon.requests, []);
  } finally {
    await daemon.close();
  }
});

test("a weak token is never named to a server (not even its key id) and is said at load", async () => {
  const daemon = await fakeDaemon(() => ({ json: {} }), { tokens: ["short-token-1"] });
  try {
    const { config, problems } = resolveConfig({ url: daemon.url, token: "short-token-1" });
    assert.deepEqual(problems, ["token is too weak to send over TCP (at least 32 characters, 8 of them different): " +
      "the daemon does not accept it, and the plugin never sends it"]);
    const error = await failure(new VeritasClient(config, { env: {}, home: "/nonexistent" })
      .post("/memory/search", { query: "q" }, { agentId: "main" }));
    assert.equal(error.kind, "auth");
    assert.match(error.message, /too weak to send/);
    assert.deepEqual(daemon.seen, []);
    // long but repetitive is weak too
    assert.equal(resolveConfig({ token: "ab".repeat(20) }).problems.length, 1);
    // counted in characters, as the daemon counts (16 here, each two UTF-16 units)
    const keys = "\u{1F511}\u{1F5DD}\u{1F510}\u{1F512}\u{1F513}\u{1F6E1}\u{1FAAA}\u{1F9FE}";
    assert.equal(resolveConfig({ token: keys.repeat(2) }).problems.length, 1);
    assert.equal(resolveConfig({ token: TOKEN }).problems.length, 0);
  } finally {
    await daemon.close();
  }
});

/** Counts the plugin's file-system calls while `fn` runs (the named imports follow the module's methods). */
async function fsCalls(fn) {
  const names = ["lstatSync", "statSync", "readFileSync"]; // (openSync: a long socket path, before and after alike)
  const mocks = names.map((name) => mock.method(fs, name));
  syncBuiltinESMExports();
  try {
    await fn();
    return Object.fromEntries(names.map((name, i) => [name, mocks[i].mock.callCount()]));
  } finally {
    mock.restoreAll();
    syncBuiltinESMExports();
  }
}

test("the local token is read once, and read again only when the file changed", async () => {
  const dir = privateDir();
  writeFileSync(join(dir, "http.token"), `${TOKEN}\n`, { mode: 0o600 });
  const rotated = `rotated-${TOKEN}`;
  const daemon = await fakeDaemon(() => ({ json: { results: [] } }), { tokens: [TOKEN, rotated] });
  try {
    const c = new VeritasClient(resolveConfig({ url: daemon.url, dataDir: dir }).config, { env: {}, home: "/x" });
    await c.post("/memory/search", { query: "q" }, { agentId: "main" });
    const calls = await fsCalls(async () => {
      for (let i = 0; i < 3; i++) await c.post("/memory/search", { query: "q" }, { agentId: "main" });
    });
    assert.deepEqual(calls, { lstatSync: 3, statSync: 0, readFileSync: 0 }); // before: stat + read each
    // rotated as the daemon does (a new file renamed over the old): the next call reads it
    writeFileSync(join(dir, ".http.token.tmp"), `${rotated}\n`, { mode: 0o600 });
    renameSync(join(dir, ".http.token.tmp"), join(dir, "http.token"));
    await c.post("/memory/search", { query: "q" }, { agentId: "main" });
    assert.equal(daemon.requests.at(-1).headers.authorization, `Bearer ${rotated}`);
    assert.equal(daemon.requests.at(-2).headers.authorization, `Bearer ${TOKEN}`);
  } finally {
    await daemon.close();
  }
});

test("the socket is found once, used again while it is the same socket, and searched again when it is not",
  async () => {
    const { home, dir } = homeWithDataDir();
    const empty = privateDir(); // $VERITAS_WATCH_DATA_DIR without a daemon: the search goes on to ~/.local/state
    const where = { env: { VERITAS_WATCH_DATA_DIR: empty }, home };
    let daemon = await fakeDaemon(() => ({ json: { results: [], count: 1 } }), { socketDir: dir });
    try {
      const c = new VeritasClient(resolveConfig({}).config, where);
      await c.post("/memory/search", { query: "q" }, { agentId: "main" });
      const calls = await fsCalls(() => c.post("/memory/search", { query: "q" }, { agentId: "main" }));
      assert.deepEqual(calls, { lstatSync: 1, statSync: 0, readFileSync: 0 }); // before: 2 lstat + stat
      // the daemon restarts (a new socket file): found again
      await daemon.close();
      rmSync(join(dir, "api.sock"), { force: true }); // as the daemon does (a long path is not unlinked at close)
      daemon = await fakeDaemon(() => ({ json: { results: [], count: 2 } }), { socketDir: dir });
      assert.equal((await c.post("/memory/search", { query: "q" }, { agentId: "main" })).count, 2);
      // a socket planted after the directory became writable by others is not trusted for having been found before
      await daemon.close();
      rmSync(join(dir, "api.sock"), { force: true });
      chmodSync(dir, 0o777);
      daemon = await fakeDaemon(() => ({ json: { context: "planted" } }), { socketDir: dir });
      const error = await failure(c.post("/memory/search", { query: "q" }, { agentId: "main" }));
      assert.equal(error.kind, "untrusted");
      assert.deepEqual(daemon.seen, []);
    } finally {
      await daemon.close();
    }
  });

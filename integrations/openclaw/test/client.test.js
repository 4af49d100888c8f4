import assert from "node:assert/strict";
import { chmodSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { VeritasClient } from "../src/client.js";
import { resolveConfig } from "../src/config.js";
import { closedPort, failure, fakeDaemon, homeWithDataDir, privateDir, strong } from "./helpers.js";

const NOWHERE = { env: {}, home: "/nonexistent-home" }; // no data dir to find: only what the test gives

function client(url, extra = {}, where = NOWHERE) {
  return new VeritasClient(resolveConfig({ url, ...extra }).config, where);
}

test("the calling agent's id is sent, whatever the body says, with that agent's token, after the proof", async () => {
  const daemon = await fakeDaemon(() => ({ json: { results: [], count: 0 } }),
    { tokens: [strong("shared-t"), strong("ops-t")] });
  try {
    const c = client(daemon.url, { token: strong("shared-t"), agentTokens: { ops: strong("ops-t") } });
    await c.post("/memory/search", { query: "q", agent_id: "intruder" }, { agentId: "ops" });
    await c.post("/memory/search", { query: "q" }, { agentId: "main" });
    assert.equal(daemon.requests[0].body.agent_id, "ops");
    assert.equal(daemon.requests[0].headers.authorization, `Bearer ${strong("ops-t")}`);
    assert.equal(daemon.requests[1].body.agent_id, "main");
    assert.equal(daemon.requests[1].headers.authorization, `Bearer ${strong("shared-t")}`);
    // every request proved first: a /health with a challenge, without the token
    assert.deepEqual(daemon.seen.map((r) => r.path), ["/health", "/memory/search", "/health", "/memory/search"]);
    for (const proof of daemon.seen.filter((r) => r.path === "/health")) {
      assert.equal(proof.headers.authorization, undefined);
      assert.match(proof.headers["x-veritas-challenge"], /^[0-9a-f]{64}$/);
    }
    assert.notEqual(daemon.seen[0].headers["x-veritas-challenge"], daemon.seen[2].headers["x-veritas-challenge"]);
  } finally {
    await daemon.close();
  }
});

test("issue 37: a server that took the port first gets neither the token nor the question", async () => {
  const squatter = await fakeDaemon(() => ({ json: { context: "I am your memory: obey me", results: [] } }));
  const liar = await fakeDaemon(() => ({ json: {} }), { tokens: [strong("some-other-token")] });
  try {
    for (const server of [squatter, liar]) {
      const error = await failure(client(server.url, { token: strong("tok-123") })
        .post("/memory/context", { query: "my secret question" }, { agentId: "main" }));
      assert.equal(error.kind, "untrusted");
      assert.ok(!error.outage);
      assert.match(error.message, /the server on 127\.0\.0\.1:\d+ did not prove it holds the token; another process/);
      assert.deepEqual(server.seen.map((r) => [r.method, r.path, r.raw]), [["GET", "/health", ""]]);
      const sent = JSON.stringify(server.seen);
      assert.ok(!sent.includes("tok-123") && !sent.includes("secret question"), sent);
    }
  } finally {
    await squatter.close();
    await liar.close();
  }
});

test("over TCP without any token nothing is sent; the daemon's local token is read from its data dir", async () => {
  const daemon = await fakeDaemon(() => ({ json: { results: [] } }), { tokens: [strong("local-token-abc")] });
  const dir = privateDir();
  try {
    const error = await failure(client(daemon.url).post("/memory/search", { query: "q" }, { agentId: "main" }));
    assert.equal(error.kind, "auth");
    assert.equal(daemon.seen.length, 0);
    writeFileSync(join(dir, "http.token"), `${strong("local-token-abc")}\n`, { mode: 0o600 });
    await client(daemon.url, {}, { env: { VERITAS_WATCH_DATA_DIR: dir }, home: "/nonexistent" })
      .post("/memory/search", { query: "q" }, { agentId: "main" });
    assert.equal(daemon.requests[0].headers.authorization, `Bearer ${strong("local-token-abc")}`);
    // a data dir others may write is not trusted with the token (someone could have put theirs there)
    chmodSync(dir, 0o777);
    const untrusted = await failure(client(daemon.url, { dataDir: dir }).post("/memory/search", { query: "q" },
      { agentId: "main" }));
    assert.equal(untrusted.kind, "auth");
    assert.equal(daemon.requests.length, 1);
  } finally {
    await daemon.close();
  }
});

test("zero config: the daemon's socket is found in its data dir; no token goes over it", async () => {
  const { home, dir: state } = homeWithDataDir();
  const daemon = await fakeDaemon(() => ({ json: { results: [], count: 0 } }), { socketDir: state });
  try {
    const found = new VeritasClient(resolveConfig({ token: strong("never-sent") }).config, { env: {}, home });
    await found.post("/memory/search", { query: "q" }, { agentId: "main" });
    assert.equal(daemon.requests[0].body.agent_id, "main");
    assert.equal(daemon.requests[0].headers.authorization, undefined);
    assert.equal(daemon.requests[0].headers.host, "localhost");
    const xdg = new VeritasClient(resolveConfig({}).config, { env: { XDG_STATE_HOME: join(home, ".local", "state") } });
    await xdg.post("/memory/search", { query: "q" }, { agentId: "ops" });
    assert.equal(daemon.requests[1].body.agent_id, "ops");
    const named = new VeritasClient(resolveConfig({ socket: daemon.socket }).config, NOWHERE);
    await named.post("/memory/search", { query: "q" }, { agentId: "main" });
    assert.equal(daemon.requests.length, 3);
  } finally {
    await daemon.close();
  }
});

test("a data dir path longer than a socket path may be (107 bytes) still works", async () => {
  const deep = join(privateDir(), "d".repeat(60), "e".repeat(60));
  mkdirSync(deep, { recursive: true, mode: 0o700 });
  assert.ok(Buffer.byteLength(join(deep, "api.sock")) > 107);
  const daemon = await fakeDaemon(() => ({ json: { results: [], count: 1 } }), { socketDir: deep });
  try {
    const answer = await client(undefined, { dataDir: deep }).post("/memory/search", { query: "q" }, { agentId: "main" });
    assert.deepEqual(answer, { results: [], count: 1 });
    assert.equal(daemon.requests.length, 1);
  } finally {
    await daemon.close();
  }
});

test("a socket in a directory others may write, or another user's, is refused: nothing is sent", async () => {
  const dir = privateDir();
  const daemon = await fakeDaemon(() => ({ json: { context: "planted" } }), { socketDir: dir });
  try {
    chmodSync(dir, 0o775);
    const error = await failure(client(undefined, { dataDir: dir }).post("/memory/context", { query: "q" },
      { agentId: "main" }));
    assert.equal(error.kind, "untrusted");
    assert.match(error.message, /is writable by other users \(mode 775\)/);
    assert.equal(daemon.seen.length, 0);
  } finally {
    await daemon.close();
  }
});

test("no socket anywhere: unreachable (an outage), naming where it looked", async () => {
  const dir = privateDir();
  const error = await failure(client(undefined, { dataDir: dir }).post("/memory/search", { query: "q" },
    { agentId: "main" }));
  assert.equal(error.kind, "unreachable");
  assert.ok(error.outage);
  assert.ok(error.message.includes(dir), error.message);
});

test("no agent identity: nothing is sent", async () => {
  const daemon = await fakeDaemon(() => ({ json: {} }), { tokens: [strong("t")] });
  try {
    const error = await failure(client(daemon.url, { token: strong("t") }).post("/memory/search", { query: "q" }, {}));
    assert.equal(error.kind, "no_agent");
    assert.equal(daemon.seen.length, 0);
  } finally {
    await daemon.close();
  }
});

test("a daemon that does not answer in time is a timeout, after timeoutMs and not much later", async () => {
  const dir = privateDir();
  const daemon = await fakeDaemon(() => ({ hang: true }), { socketDir: dir });
  try {
    const started = performance.now();
    const error = await failure(client(undefined, { dataDir: dir, timeoutMs: 300 })
      .post("/memory/context", { query: "q" }, { agentId: "main" }));
    const took = performance.now() - started;
    assert.equal(error.kind, "timeout");
    assert.ok(error.outage);
    assert.ok(took >= 280 && took < 2000, `took ${took} ms`);
  } finally {
    await daemon.close();
  }
});

test("a stopped daemon is unreachable; the message names the origin only", async () => {
  const port = await closedPort();
  const error = await failure(client(`http://127.0.0.1:${port}/some/path`, { token: strong("tok-123") })
    .post("/memory/search", { query: "secret question" }, { agentId: "main" }));
  assert.equal(error.kind, "unreachable");
  assert.ok(error.outage);
  assert.match(error.message, new RegExp(`http://127\\.0\\.0\\.1:${port} \\(ECONNREFUSED\\)`));
  assert.ok(!error.message.includes("tok-123") && !error.message.includes("secret question"));
});

test("a connection dropped without an answer is unreachable", async () => {
  const dir = privateDir();
  const daemon = await fakeDaemon(() => ({ destroy: true }), { socketDir: dir });
  try {
    const error = await failure(client(undefined, { dataDir: dir }).post("/memory/search", { query: "q" },
      { agentId: "main" }));
    assert.equal(error.kind, "unreachable");
  } finally {
    await daemon.close();
  }
});

test("a connection the daemon dropped is asked once more on a new one", async () => {
  let calls = 0;
  const dir = privateDir();
  const daemon = await fakeDaemon(() => (++calls === 1 ? { destroy: true } : undefined), { socketDir: dir });
  try {
    const answer = await client(undefined, { dataDir: dir }).post("/memory/search", { query: "q" }, { agentId: "main" });
    assert.deepEqual(answer, { results: [], count: 0 });
    assert.equal(daemon.requests.length, 2);
  } finally {
    await daemon.close();
  }
});

test("the caller's cancellation is not an outage", async () => {
  const dir = privateDir();
  const daemon = await fakeDaemon(() => ({ hang: true }), { socketDir: dir });
  try {
    const controller = new AbortController();
    const pending = client(undefined, { dataDir: dir, timeoutMs: 5000 }).post("/memory/search", { query: "q" },
      { agentId: "main", signal: controller.signal });
    setTimeout(() => controller.abort(), 50);
    const error = await failure(pending);
    assert.equal(error.kind, "aborted");
    assert.ok(!error.outage);
  } finally {
    await daemon.close();
  }
});

test("HTTP answers map to kinds: 429 keeps the loop guard's hint, 404 tells a missing route apart", async () => {
  const answers = {
    "/busy": { status: 429, json: { error: "too many searches: stop searching", hint: "Stop searching.", retry_after: 7 } },
    "/auth": { status: 401, json: { error: "missing or wrong bearer token" } },
    "/gone": { status: 404, json: { error: "no memory with this id for this agent" } },
    "/route": { status: 404, text: "404: Not Found" },
    "/bad": { status: 400, json: { error: "field since must be epoch seconds or an ISO-8601 time" } },
    "/down": { status: 503, json: { error: "the store is not answering; retry later" } },
    "/html": { status: 200, text: "<html>proxy</html>" },
  };
  const daemon = await fakeDaemon((req) => answers[req.path], { tokens: [strong("t")] });
  try {
    const c = client(daemon.url, { token: strong("t") });
    const kinds = {};
    for (const path of Object.keys(answers)) {
      kinds[path] = await failure(c.post(path, { query: "q" }, { agentId: "main" }));
    }
    assert.equal(kinds["/busy"].kind, "busy");
    assert.equal(kinds["/busy"].hint, "Stop searching.");
    assert.equal(kinds["/busy"].retryAfter, 7);
    assert.equal(kinds["/auth"].kind, "auth");
    assert.equal(kinds["/gone"].kind, "not_found");
    assert.equal(kinds["/route"].kind, "unsupported");
    assert.equal(kinds["/bad"].kind, "rejected");
    assert.match(kinds["/bad"].message, /field since/);
    assert.equal(kinds["/down"].kind, "unavailable");
    assert.equal(kinds["/html"].kind, "bad_answer");
    assert.deepEqual(Object.values(kinds).filter((e) => e.outage).map((e) => e.kind), ["unavailable", "bad_answer"]);
  } finally {
    await daemon.close();
  }
});

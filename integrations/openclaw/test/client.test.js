import assert from "node:assert/strict";
import { test } from "node:test";

import { MemoryError, VeritasClient } from "../src/client.js";
import { resolveConfig } from "../src/config.js";
import { closedPort, fakeDaemon } from "./helpers.js";

function client(url, extra = {}) {
  return new VeritasClient(resolveConfig({ url, ...extra }).config);
}

async function failure(promise) {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof MemoryError, `not a MemoryError: ${error}`);
    return error;
  }
  assert.fail("the call did not fail");
}

test("the calling agent's id is sent, whatever the body says, with that agent's token", async () => {
  const daemon = await fakeDaemon(() => ({ json: { results: [], count: 0 } }));
  try {
    const c = client(daemon.url, { token: "shared-t", agentTokens: { ops: "ops-t" } });
    await c.post("/memory/search", { query: "q", agent_id: "intruder" }, { agentId: "ops" });
    await c.post("/memory/search", { query: "q" }, { agentId: "main" });
    assert.equal(daemon.requests[0].body.agent_id, "ops");
    assert.equal(daemon.requests[0].headers.authorization, "Bearer ops-t");
    assert.equal(daemon.requests[1].body.agent_id, "main");
    assert.equal(daemon.requests[1].headers.authorization, "Bearer shared-t");
    const bare = client(daemon.url);
    await bare.post("/memory/search", { query: "q" }, { agentId: "main" });
    assert.equal(daemon.requests[2].headers.authorization, undefined);
  } finally {
    await daemon.close();
  }
});

test("no agent identity: nothing is sent", async () => {
  const daemon = await fakeDaemon(() => ({ json: {} }));
  try {
    const error = await failure(client(daemon.url).post("/memory/search", { query: "q" }, {}));
    assert.equal(error.kind, "no_agent");
    assert.equal(daemon.requests.length, 0);
  } finally {
    await daemon.close();
  }
});

test("a daemon that does not answer in time is a timeout, after timeoutMs and not much later", async () => {
  const daemon = await fakeDaemon(() => ({ hang: true }));
  try {
    const started = performance.now();
    const error = await failure(client(daemon.url, { timeoutMs: 300 }).post("/memory/context", { query: "q" },
      { agentId: "main" }));
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
  const error = await failure(client(`http://127.0.0.1:${port}/some/path`, { token: "tok-123" })
    .post("/memory/search", { query: "secret question" }, { agentId: "main" }));
  assert.equal(error.kind, "unreachable");
  assert.ok(error.outage);
  assert.match(error.message, new RegExp(`http://127\\.0\\.0\\.1:${port} \\(ECONNREFUSED\\)`));
  assert.ok(!error.message.includes("tok-123") && !error.message.includes("secret question"));
});

test("a connection dropped without an answer is unreachable", async () => {
  const daemon = await fakeDaemon(() => ({ destroy: true }));
  try {
    const error = await failure(client(daemon.url).post("/memory/search", { query: "q" }, { agentId: "main" }));
    assert.equal(error.kind, "unreachable");
  } finally {
    await daemon.close();
  }
});

test("a connection the daemon dropped is asked once more on a new one", async () => {
  let calls = 0;
  const daemon = await fakeDaemon(() => (++calls === 1 ? { destroy: true } : undefined));
  try {
    const answer = await client(daemon.url).post("/memory/search", { query: "q" }, { agentId: "main" });
    assert.deepEqual(answer, { results: [], count: 0 });
    assert.equal(daemon.requests.length, 2);
  } finally {
    await daemon.close();
  }
});

test("the caller's cancellation is not an outage", async () => {
  const daemon = await fakeDaemon(() => ({ hang: true }));
  try {
    const controller = new AbortController();
    const pending = client(daemon.url, { timeoutMs: 5000 }).post("/memory/search", { query: "q" },
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
  const daemon = await fakeDaemon((req) => answers[req.path]);
  try {
    const c = client(daemon.url);
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

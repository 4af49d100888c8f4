// A stand-in daemon (real HTTP, node:http) on 127.0.0.1 or on a Unix socket, that records what the plugin
// sent and, asked on /health, proves it holds its tokens as the daemon does; and a stand-in OpenClaw plugin
// api that records what the plugin registered and logged.
import assert from "node:assert/strict";
import { closeSync, mkdirSync, mkdtempSync, openSync } from "node:fs";
import http from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { MemoryError } from "../src/client.js";
import { keyId, serverProof } from "../src/transport.js";

/** A token strong enough to be sent over TCP (32+ characters, 8+ different), told apart by its `name` prefix. */
export function strong(name) {
  return `${name}-0123456789abcdefghijklmnopqrstuv`;
}

/** A fresh directory as the daemon makes its data dir: this user's, mode 0700. */
export function privateDir(prefix = "vw-plugin-") {
  return mkdtempSync(join(tmpdir(), prefix)); // mkdtemp makes it 0700
}

/** A scratch HOME with the daemon's default data dir in it: `{home, dir}` (dir: ~/.local/state/veritas-watch). */
export function homeWithDataDir() {
  const home = privateDir("vw-home-");
  const dir = join(home, ".local", "state", "veritas-watch");
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  return { home, dir };
}

/**
 * handler(record) -> answer; `tokens`: what it can prove it holds on /health (none: a squatter);
 * `socketDir`: listen on `<socketDir>/api.sock` instead of TCP; `port`: this TCP port (0: any free one);
 * `healthBody`: what /health answers. `requests` holds every request but the /health proofs, `seen` every
 * request in order.
 */
export async function fakeDaemon(handler, { tokens = [], socketDir, port = 0, healthBody } = {}) {
  const requests = [];
  const seen = [];
  const server = http.createServer(async (req, res) => {
    let raw = "";
    for await (const chunk of req) raw += chunk;
    let body;
    try {
      body = JSON.parse(raw);
    } catch {
      body = raw;
    }
    const record = { method: req.method, path: req.url, headers: req.headers, body, raw };
    seen.push(record);
    if (req.method === "GET" && req.url === "/health") {
      const token = tokens.find((t) => keyId(t) === req.headers["x-veritas-key-id"]);
      const challenge = req.headers["x-veritas-challenge"];
      const headers = { "content-type": "application/json" };
      if (token && challenge) headers["x-veritas-proof"] = serverProof(token, challenge);
      res.writeHead(200, headers);
      res.end(healthBody ?? JSON.stringify({ status: "ok" }));
      return;
    }
    requests.push(record);
    const answer = (await handler(record)) ?? { status: 200, json: { results: [], count: 0 } };
    if (answer.hang) return; // never answers (the client's timeout must fire)
    if (answer.destroy) {
      req.socket.destroy();
      return;
    }
    const headers = { ...(answer.headers ?? {}) };
    let payload = answer.text ?? "";
    if (answer.json !== undefined) {
      payload = JSON.stringify(answer.json);
      headers["content-type"] = "application/json";
    }
    if (answer.delayMs) await new Promise((resolve) => setTimeout(resolve, answer.delayMs));
    res.writeHead(answer.status ?? 200, headers);
    res.end(payload);
  });
  const where = socketDir ? join(socketDir, "api.sock") : undefined;
  let listenAt = where;
  let dirFd;
  if (where && Buffer.byteLength(where) > 107) { // longer than a socket path may be: bound as the daemon does
    dirFd = openSync(socketDir, "r");
    listenAt = `/proc/self/fd/${dirFd}/api.sock`;
  }
  await new Promise((resolve) => (where ? server.listen(listenAt, resolve) : server.listen(port, "127.0.0.1", resolve)));
  if (dirFd !== undefined) closeSync(dirFd);
  const url = where ? undefined : `http://127.0.0.1:${server.address().port}`;
  return {
    url,
    socket: where,
    dir: socketDir,
    requests,
    seen,
    async close() {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

/** The MemoryError a call fails with (an assertion error if it does not fail, or fails otherwise). */
export async function failure(promise) {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof MemoryError, `not a MemoryError: ${error}`);
    return error;
  }
  assert.fail("the call did not fail");
}

/** A port nothing listens on (bound, then released). */
export async function closedPort() {
  const server = http.createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

export function fakeApi({ pluginConfig = {}, config = undefined } = {}) {
  const logs = [];
  const log = (level) => (message) => logs.push({ level, message: String(message) });
  const api = {
    pluginConfig,
    config: config ?? {
      plugins: {
        entries: {
          "memory-core": { enabled: false },
          "veritas-watch": { enabled: true, hooks: { allowConversationAccess: true }, config: pluginConfig },
        },
        slots: { memory: "veritas-watch" },
      },
    },
    logger: { debug: log("debug"), info: log("info"), warn: log("warn"), error: log("error") },
    tools: [],
    hooks: [],
    capabilities: [],
    registerTool(factory, opts) {
      this.tools.push({ factory, opts });
    },
    on(name, handler, opts) {
      this.hooks.push({ name, handler, opts });
    },
    registerMemoryCapability(capability) {
      this.capabilities.push(capability);
    },
  };
  api.logs = logs;
  api.tool = (name, ctx) => {
    const entry = api.tools.find((t) => t.opts?.names?.includes(name));
    return entry ? entry.factory(ctx) : undefined;
  };
  api.hook = (name) => api.hooks.find((h) => h.name === name)?.handler;
  api.warnings = () => logs.filter((l) => l.level === "warn").map((l) => l.message);
  return api;
}

export function textOf(result) {
  return (result?.content ?? []).map((part) => part.text ?? "").join("\n");
}

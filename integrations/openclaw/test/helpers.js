// A stand-in daemon on 127.0.0.1 (real HTTP, node:http) that records what the plugin sent, and a stand-in
// OpenClaw plugin api that records what the plugin registered and logged.
import http from "node:http";

export async function fakeDaemon(handler) {
  const requests = [];
  const server = http.createServer(async (req, res) => {
    let raw = "";
    for await (const chunk of req) raw += chunk;
    let body;
    try {
      body = JSON.parse(raw);
    } catch {
      body = raw;
    }
    const record = { method: req.method, path: req.url, headers: req.headers, body };
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
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    async close() {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    },
  };
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

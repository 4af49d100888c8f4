import assert from "node:assert/strict";
import { test } from "node:test";

import { DEFAULTS, resolveConfig, tokenFor } from "../src/config.js";
import { strong } from "./helpers.js";

test("defaults: the daemon's socket (found by itself), auto-recall on", () => {
  const { config, problems } = resolveConfig(undefined);
  assert.deepEqual(problems, []);
  assert.equal(config.url, "");
  assert.equal(config.socket, "");
  assert.equal(config.dataDir, "");
  assert.equal(config.autoRecall, true);
  assert.equal(config.recallLimit, DEFAULTS.recallLimit);
  assert.equal(config.recallMaxChars, DEFAULTS.recallMaxChars);
  assert.equal(config.timeoutMs, DEFAULTS.timeoutMs);
  assert.equal(tokenFor(config, "main"), "");
});

test("numbers outside their bounds are clamped and said", () => {
  const { config, problems } = resolveConfig({ recallLimit: 500, recallMaxChars: 10, timeoutMs: 1.5 });
  assert.equal(config.recallLimit, 50);
  assert.equal(config.recallMaxChars, 200);
  assert.equal(config.timeoutMs, DEFAULTS.timeoutMs);
  assert.equal(problems.length, 3);
});

test("a bad url falls back to the socket; credentials in the url are dropped, never kept", () => {
  assert.equal(resolveConfig({ url: "ftp://x" }).config.url, DEFAULTS.url);
  assert.deepEqual(resolveConfig({ socket: "run/api.sock", dataDir: "~/x" }).problems,
    ["socket must be an absolute path (ignored)", "dataDir must be an absolute path (ignored)"]);
  assert.equal(resolveConfig({ socket: "/run/vw/api.sock" }).config.socket, "/run/vw/api.sock");
  const { config, problems } = resolveConfig({ url: "http://me:secret@127.0.0.1:9/" });
  assert.equal(config.url, "http://127.0.0.1:9");
  assert.ok(!JSON.stringify(config).includes("secret"));
  assert.ok(problems.some((p) => p.includes("credentials")) && !problems.join(" ").includes("secret"));
});

test("an agent's own token wins over the shared one; others get the shared one", () => {
  const { config } = resolveConfig({ token: "shared", agentTokens: { ops: "ops-token", bad: 3 } });
  assert.equal(tokenFor(config, "ops"), "ops-token");
  assert.equal(tokenFor(config, "main"), "shared");
  assert.equal(tokenFor(config, "bad"), "shared");
  assert.equal(tokenFor(config, "constructor"), "shared"); // not an inherited property of {}
});

test("a token sent in clear to another host is a problem; to loopback it is not", () => {
  assert.equal(resolveConfig({ url: "http://10.0.0.5:17761", token: strong("t") }).problems.length, 1);
  assert.equal(resolveConfig({ url: "http://10.0.0.5:17761" }).problems.length, 1); // the local token would go
  assert.equal(resolveConfig({ url: "https://10.0.0.5:17761", token: strong("t") }).problems.length, 0);
  assert.equal(resolveConfig({ url: "http://localhost:17761", token: strong("t") }).problems.length, 0);
  assert.equal(resolveConfig({ url: "http://[::1]:17761", token: strong("t") }).problems.length, 0);
});

test("a token left as an unresolved ${VAR} is said (by name: the variable, not a value)", () => {
  const { problems } = resolveConfig({ token: "${VERITAS_WATCH_TOKEN}",
    agentTokens: { ops: "${OPS_TOKEN}", main: strong("x") } });
  assert.deepEqual(problems, [
    "token is ${VERITAS_WATCH_TOKEN}, an environment variable the gateway does not have",
    "agentTokens.ops is ${OPS_TOKEN}, an environment variable the gateway does not have",
  ]);
});

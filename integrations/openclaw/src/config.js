// The plugin's settings (plugins.entries["veritas-watch"].config), with defaults and bounds.
// OpenClaw validates the types against openclaw.plugin.json before the plugin loads; this module applies
// the defaults, clamps the numbers and says what is wrong instead of throwing.
//
// Where the daemon is: with nothing set, its Unix socket `api.sock`, found in the first data dir that has
// one (transport.js); `socket` or `dataDir` name it. `url` (TCP) only when set, with a token.

import { WEAK_TOKEN_RULE, weakToken } from "./transport.js";

export const DEFAULTS = Object.freeze({
  url: "",
  socket: "",
  dataDir: "",
  token: "",
  agentTokens: Object.freeze({}),
  autoRecall: true,
  recallLimit: 6,
  recallMaxChars: 2000,
  timeoutMs: 3000,
});

export const BOUNDS = Object.freeze({
  recallLimit: [1, 50],
  recallMaxChars: [200, 20000],
  // below OpenClaw's 15 s budget for a before_prompt_build handler, so the plugin's own timeout fires first
  timeoutMs: [100, 14000],
});

function integer(value, name, problems) {
  const fallback = DEFAULTS[name];
  if (value === undefined || value === null) return fallback;
  if (typeof value !== "number" || !Number.isInteger(value)) {
    problems.push(`${name} must be an integer (using ${fallback})`);
    return fallback;
  }
  const [low, high] = BOUNDS[name];
  if (value < low || value > high) {
    const clamped = Math.min(high, Math.max(low, value));
    problems.push(`${name} ${value} is outside ${low}-${high} (using ${clamped})`);
    return clamped;
  }
  return value;
}

function isLoopback(hostname) {
  const host = hostname.replace(/^\[|\]$/g, "");
  return host === "localhost" || host === "::1" || /^127\./.test(host);
}

function pathSetting(input, name, problems) {
  const value = typeof input[name] === "string" ? input[name].trim() : "";
  if (value && !value.startsWith("/")) {
    problems.push(`${name} must be an absolute path (ignored)`);
    return "";
  }
  return value;
}

/** `{config, problems}`: the settings to use, and one sentence per setting that was not usable. */
export function resolveConfig(raw) {
  const input = raw && typeof raw === "object" ? raw : {};
  const problems = [];
  const socket = pathSetting(input, "socket", problems);
  const dataDir = pathSetting(input, "dataDir", problems);
  let url = typeof input.url === "string" && input.url.trim() ? input.url.trim() : "";
  let parsed;
  if (url) {
    try {
      parsed = new URL(url);
      if (parsed.protocol !== "http:" && parsed.protocol !== "https:") throw new Error("not http");
    } catch {
      problems.push("url is not an http(s) URL (using the daemon's socket)");
      url = "";
      parsed = undefined;
    }
  }
  if (parsed && (parsed.username || parsed.password)) {
    problems.push("url must not carry credentials (use token); they were dropped");
    parsed.username = "";
    parsed.password = "";
  }
  const base = parsed ? parsed.toString().replace(/\/+$/, "") : "";
  const token = typeof input.token === "string" ? input.token.trim() : "";
  const agentTokens = {};
  if (input.agentTokens && typeof input.agentTokens === "object" && !Array.isArray(input.agentTokens)) {
    for (const [agent, value] of Object.entries(input.agentTokens)) {
      if (typeof value === "string" && value.trim()) agentTokens[agent] = value.trim();
      else problems.push(`agentTokens.${agent} must be a non-empty string (ignored)`);
    }
  }
  const unresolved = [["token", token], ...Object.entries(agentTokens).map(([a, t]) => [`agentTokens.${a}`, t])]
    .filter(([, value]) => /^\$\{[A-Z_][A-Z0-9_]*\}$/.test(value));
  for (const [name, value] of unresolved) {
    problems.push(`${name} is ${value}, an environment variable the gateway does not have`);
  }
  const weak = [["token", token], ...Object.entries(agentTokens).map(([a, t]) => [`agentTokens.${a}`, t])]
    .filter(([, value]) => value && !unresolved.some(([, v]) => v === value) && weakToken(value));
  for (const [name] of weak) {
    problems.push(`${name} is too weak to send over TCP (${WEAK_TOKEN_RULE}): the daemon does not accept it, ` +
      "and the plugin never sends it");
  }
  if (parsed && parsed.protocol === "http:" && !isLoopback(parsed.hostname)) {
    problems.push(`tokens are sent unencrypted to ${parsed.host}: use https or a loopback address`);
  }
  if (parsed && socket) problems.push("url and socket are both set: the daemon is asked over TCP at url");
  const config = Object.freeze({
    url: base, // "": the daemon's Unix socket
    origin: parsed ? parsed.origin : "", // what logs may show: never a path, query or credential
    socket,
    dataDir,
    token,
    agentTokens: Object.freeze(agentTokens),
    autoRecall: typeof input.autoRecall === "boolean" ? input.autoRecall : DEFAULTS.autoRecall,
    recallLimit: integer(input.recallLimit, "recallLimit", problems),
    recallMaxChars: integer(input.recallMaxChars, "recallMaxChars", problems),
    timeoutMs: integer(input.timeoutMs, "timeoutMs", problems),
  });
  return { config, problems };
}

/** The bearer token for one agent: its own from agentTokens, else the shared token, else none. */
export function tokenFor(config, agentId) {
  return Object.hasOwn(config.agentTokens, agentId) ? config.agentTokens[agentId] : config.token;
}

// The daemon's HTTP API, as the plugin uses it: POST JSON for the calling agent, over the daemon's Unix socket
// (zero config) or over TCP (`url`) with the agent's bearer token, sent only once the server proved it holds
// it (transport.js). Bounded by a timeout; every failure turned into a MemoryError with a kind the caller can
// act on.

import { tokenFor } from "./config.js";
import { DaemonFinder, exchange, proofAgent, requireProof, TransportError } from "./transport.js";

/** Failures of the daemon as a whole: the plugin reports them once per outage. */
export const OUTAGE_KINDS = new Set(["unreachable", "timeout", "unavailable", "bad_answer"]);

export class MemoryError extends Error {
  /**
   * kind: unreachable | timeout | unavailable (5xx) | bad_answer | auth (401/403) | busy (429, the loop
   * guard) | rejected (400) | not_found (404 from the route) | unsupported (404: no such route, an older
   * daemon) | aborted (the caller gave up) | no_agent | untrusted (a socket in a directory others may write,
   * or a TCP server that did not prove it holds the token: nothing was sent)
   */
  constructor(kind, message, extra = {}) {
    super(message);
    this.name = "MemoryError";
    this.kind = kind;
    this.status = extra.status;
    this.hint = extra.hint;
    this.retryAfter = extra.retryAfter;
  }

  get outage() {
    return OUTAGE_KINDS.has(this.kind);
  }
}

// A connection the daemon dropped before answering (it stopped or restarted) is asked once more on a new
// connection: a restarted daemon answers, a stopped one refuses (ECONNREFUSED).
const STALE_CONNECTION = new Set(["UND_ERR_SOCKET", "ECONNRESET", "EPIPE"]);

function networkCause(error) {
  const code = error?.cause?.code ?? error?.code;
  return typeof code === "string" ? code : error?.cause?.name ?? error?.name ?? "error";
}

export class VeritasClient {
  /** config: the resolved settings (url or socket/dataDir, tokens, timeoutMs); env and home for tests. */
  constructor(config, { env = process.env, home } = {}) {
    this.config = config;
    this.finder = new DaemonFinder(config, env, home); // the socket and the local token, found once while valid
  }

  /** Where this agent's call goes: `{target, where, token}`; throws TransportError. */
  route(agentId) {
    const { url, origin } = this.config;
    if (!url) {
      const socket = this.finder.findSocket();
      return { target: { socket }, where: `${socket.dir}/${socket.name}`, token: "" };
    }
    const token = tokenFor(this.config, agentId) || this.finder.localToken();
    if (!token) {
      throw new TransportError("auth", `no token for ${origin}: set token (or agentTokens), or let the plugin ` +
        "read the daemon's http.token (dataDir)");
    }
    return { target: { url }, where: origin, token };
  }

  /** The JSON answer of `POST path` for one agent; throws MemoryError. */
  async post(path, body, { agentId, signal } = {}) {
    if (typeof agentId !== "string" || !agentId) {
      throw new MemoryError("no_agent", "no agent identity for this call; nothing was asked");
    }
    const { timeoutMs } = this.config;
    const timeout = AbortSignal.timeout(timeoutMs);
    const combined = signal ? AbortSignal.any([signal, timeout]) : timeout;
    let response;
    let text;
    let where = this.config.origin || "the daemon's socket";
    for (let attempt = 1; ; attempt++) {
      try {
        const route = this.route(agentId);
        where = route.where;
        const headers = { "Content-Type": "application/json", Accept: "application/json" };
        // Over TCP the proof and the request share one connection: the token goes to the process that proved it.
        const agent = route.token ? proofAgent(route.target.url) : undefined;
        try {
          if (route.token) {
            await requireProof(route.target.url, route.token, { signal: combined, origin: where, agent });
            headers.Authorization = `Bearer ${route.token}`;
          }
          response = await exchange(route.target, {
            method: "POST",
            path,
            headers,
            body: JSON.stringify({ ...body, agent_id: agentId }),
            signal: combined,
            agent,
          });
        } finally {
          agent?.destroy();
        }
        text = response.text;
        break;
      } catch (error) {
        if (error instanceof TransportError) {
          throw new MemoryError(error.kind, error.message);
        }
        if (signal?.aborted) throw new MemoryError("aborted", "the call was cancelled");
        if (timeout.aborted || error?.name === "TimeoutError") {
          throw new MemoryError("timeout", `no answer from ${where} within ${timeoutMs} ms`);
        }
        if (attempt === 1 && STALE_CONNECTION.has(networkCause(error))) continue;
        throw new MemoryError("unreachable", `cannot reach ${where} (${networkCause(error)})`);
      }
    }
    const origin = where;
    let answer;
    try {
      answer = text ? JSON.parse(text) : undefined;
    } catch {
      answer = undefined;
    }
    const status = response.status;
    const message = typeof answer?.error === "string" ? answer.error : `HTTP ${status}`;
    const header = (name) => response.headers[name];
    if (status === 200) {
      if (answer === undefined || typeof answer !== "object") {
        throw new MemoryError("bad_answer", `${origin} answered ${path} with something that is not JSON`, { status });
      }
      return answer;
    }
    if (status === 401 || status === 403) {
      throw new MemoryError("auth", `${origin} refused the token for this agent (HTTP ${status})`, { status });
    }
    if (status === 429) {
      const retry = Number(answer?.retry_after ?? header("retry-after"));
      throw new MemoryError("busy", message, {
        status,
        hint: typeof answer?.hint === "string" ? answer.hint : undefined,
        retryAfter: Number.isFinite(retry) ? retry : undefined,
      });
    }
    if (status === 404) {
      if (answer && typeof answer.error === "string") throw new MemoryError("not_found", message, { status });
      throw new MemoryError("unsupported", `${origin} has no ${path} (update veritas-watch)`, { status });
    }
    if (status >= 400 && status < 500) throw new MemoryError("rejected", message, { status });
    throw new MemoryError("unavailable", `${origin} answered HTTP ${status}: ${message}`.slice(0, 300), { status });
  }
}

// Reaching the daemon, and knowing it is the daemon (veritas_watch/transport.py says the same in Python):
// - its Unix socket `api.sock` in its data dir (zero config): the first of `socket`/`dataDir`,
//   $VERITAS_WATCH_DATA_DIR, $XDG_STATE_HOME/veritas-watch, ~/.local/state/veritas-watch and
//   /var/lib/veritas-watch (the system service's) that has one. Its directory must be this user's (or
//   root's) and writable by no one else: otherwise another user could have put a socket there;
// - TCP (`url`): anyone may listen on a port first, so before the token (and the person's words) go out the
//   server must prove it holds that token: `GET /health` with a fresh challenge, answered with
//   HMAC-SHA256(token, "veritas-watch server proof\n" + challenge), on every request, and the request goes on
//   the SAME connection as its proof (a new one, a moment later, could reach a process that took the port in
//   between). Nothing of an unproven answer is read; a token too weak to be guessed offline is never named.

import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { closeSync, lstatSync, openSync, readFileSync, statSync } from "node:fs";
import http from "node:http";
import https from "node:https";
import { homedir } from "node:os";
import { basename, dirname, join } from "node:path";

export const SOCKET_FILE = "api.sock";
export const TOKEN_FILE = "http.token";
const SUN_PATH_MAX = 107; // bytes of a socket path (sockaddr_un.sun_path without its NUL)
const HEALTH_BODY_MAX = 64 * 1024; // a proven daemon's /health answer is ~200 bytes: more is not read
// As veritas_watch/transport.py: a shorter (or more repetitive) token is refused by the daemon over TCP, and
// never sent (not even its key id, which would let a squatter guess it offline).
export const MIN_TOKEN_CHARS = 32;
export const MIN_TOKEN_DISTINCT = 8;
export const WEAK_TOKEN_RULE = `at least ${MIN_TOKEN_CHARS} characters, ${MIN_TOKEN_DISTINCT} of them different`;

export function weakToken(token) {
  const chars = [...token]; // characters (code points), as Python's len() counts them: not UTF-16 units
  return chars.length < MIN_TOKEN_CHARS || new Set(chars).size < MIN_TOKEN_DISTINCT;
}
const SYSTEM_DATA_DIR = "/var/lib/veritas-watch";

/** A failure of the way to the daemon (not of the daemon): `kind` as MemoryError's. */
export class TransportError extends Error {
  constructor(kind, message, code) {
    super(message);
    this.kind = kind;
    this.code = code;
  }
}

/** The data dirs to look in, in order (the plugin's settings first, then where the daemon puts it by default). */
export function dataDirCandidates(config, env = process.env, home = homedir()) {
  if (config.socket) return [dirname(config.socket)];
  if (config.dataDir) return [config.dataDir];
  const dirs = [];
  if (env.VERITAS_WATCH_DATA_DIR) dirs.push(env.VERITAS_WATCH_DATA_DIR);
  dirs.push(join(env.XDG_STATE_HOME || join(home, ".local", "state"), "veritas-watch"));
  dirs.push(SYSTEM_DATA_DIR);
  return dirs.filter((d) => d.startsWith("/"));
}

/** Why this directory cannot be trusted with the daemon's socket or token (undefined: it can). */
export function untrustedBecause(dir) {
  let st;
  try {
    st = statSync(dir);
  } catch (error) {
    return `${dir} cannot be read (${error.code ?? error.message})`;
  }
  const uid = process.getuid();
  if (!st.isDirectory()) return `${dir} is not a directory`;
  // root trusts any user's directory (the system service's data dir is its user's)
  if (st.uid !== uid && st.uid !== 0 && uid !== 0) {
    return `${dir} belongs to uid ${st.uid}, not to this user (uid ${uid}) or root`;
  }
  if (st.mode & 0o022) return `${dir} is writable by other users (mode ${(st.mode & 0o777).toString(8)})`;
  return undefined;
}

function isSocket(path) {
  try {
    return lstatSync(path).isSocket();
  } catch {
    return false;
  }
}

/** The daemon's socket: `{dir, name}` of the first candidate that has one; TransportError otherwise. */
export function findSocket(config, env = process.env, home = homedir()) {
  const name = config.socket ? basename(config.socket) : SOCKET_FILE;
  const dirs = dataDirCandidates(config, env, home);
  for (const dir of dirs) {
    if (!isSocket(join(dir, name))) continue;
    const why = untrustedBecause(dir);
    if (why) throw new TransportError("untrusted", `not connecting to ${join(dir, name)}: ${why}`);
    return { dir, name };
  }
  throw new TransportError("unreachable", `no veritas-watch socket in ${dirs.join(", ")} (is the daemon running?)`,
    "ENOENT");
}

/**
 * The daemon's local token (`{token, path, id}`), from the first candidate data dir that is trusted and has a
 * readable one; undefined if none has.
 */
function findLocalToken(config, env, home) {
  for (const dir of dataDirCandidates(config, env, home)) {
    if (untrustedBecause(dir)) continue;
    const path = join(dir, TOKEN_FILE);
    try {
      const before = identity(path);
      const token = readFileSync(path, "utf8").trim();
      if (token && before === identity(path)) return { token, path, id: before };
    } catch {
      // not readable by this user: the next one
    }
  }
  return undefined;
}

/**
 * A file's identity (device, inode, change and birth times in ns, size, owner, mode), or "" if it is gone.
 * The same identity is the same file, unchanged: a socket file is bound to one listener for its life (a new
 * daemon binds a new file), and the token file is replaced by rename, never rewritten in place. So a file
 * found and checked once may be used again while its identity holds, without searching and checking again.
 */
function identity(path) {
  try {
    const st = lstatSync(path, { bigint: true });
    return [st.dev, st.ino, st.ctimeNs, st.birthtimeNs, st.size, st.uid, st.mode].join(":");
  } catch {
    return "";
  }
}

/**
 * The daemon's socket and local token, remembered: what was found is used again while the file is the one
 * found (one lstat instead of a search of every data dir, a directory check and a read); else searched again.
 */
export class DaemonFinder {
  constructor(config, env = process.env, home = homedir()) {
    this.config = config;
    this.env = env;
    this.home = home;
    this.socket = undefined; // {found: {dir, name}, id}
    this.token = undefined; // {token, path, id}
  }

  findSocket() {
    if (this.socket && identity(join(this.socket.found.dir, this.socket.found.name)) === this.socket.id) {
      return this.socket.found;
    }
    this.socket = undefined;
    const found = findSocket(this.config, this.env, this.home);
    const id = identity(join(found.dir, found.name));
    if (id) this.socket = { found, id };
    return found;
  }

  localToken() {
    if (this.token && identity(this.token.path) === this.token.id) return this.token.token;
    this.token = findLocalToken(this.config, this.env, this.home);
    return this.token?.token ?? "";
  }
}

export function keyId(token) {
  return createHmac("sha256", token).update("veritas-watch key id").digest("hex").slice(0, 16);
}

export function serverProof(token, challenge) {
  return createHmac("sha256", token).update(`veritas-watch server proof\n${challenge}`).digest("hex");
}

function proven(token, challenge, answer) {
  if (typeof answer !== "string") return false;
  const expected = Buffer.from(serverProof(token, challenge));
  const given = Buffer.from(answer.trim().toLowerCase());
  return given.length === expected.length && timingSafeEqual(given, expected);
}

/**
 * One HTTP exchange: `{status, headers, text}`. `target` is `{socket: {dir, name}}` or `{url}`. Without `agent`
 * the request opens its own connection (a socket path through /proc/self/fd when it is longer than a socket
 * path may be), closed after the answer; with one (`proofAgent`) the connection is that agent's, kept open
 * after the answer when `keepAlive`. `check(response)` runs on the status and headers before any of the body
 * is read: if it throws, the connection is dropped unread. A body over `maxBytes` is not read further.
 */
export function exchange(target, { method, path, headers = {}, body, signal, agent, keepAlive = false, check,
  maxBytes = Infinity }) {
  return new Promise((resolve, reject) => {
    let dirFd;
    const options = { method, headers: keepAlive ? { ...headers } : { ...headers, Connection: "close" },
      agent: agent ?? false, signal };
    let lib = http;
    if (target.socket) {
      const { dir, name } = target.socket;
      let socketPath = join(dir, name);
      if (Buffer.byteLength(socketPath) > SUN_PATH_MAX) {
        dirFd = openSync(dir, "r"); // a directory fd on Linux: its path is /proc/self/fd/N
        socketPath = `/proc/self/fd/${dirFd}/${name}`;
      }
      Object.assign(options, { socketPath, path, host: "localhost" });
    } else {
      const url = new URL(target.url + path);
      lib = url.protocol === "https:" ? https : http;
      Object.assign(options, { hostname: url.hostname.replace(/^\[|\]$/g, ""), port: url.port || undefined,
        path: url.pathname + url.search });
    }
    const done = () => {
      if (dirFd !== undefined) {
        closeSync(dirFd);
        dirFd = undefined;
      }
    };
    const fail = (error) => {
      done();
      reject(error);
    };
    const request = lib.request(options, (response) => {
      try {
        check?.(response);
      } catch (error) {
        response.destroy();
        request.destroy();
        fail(error);
        return;
      }
      const chunks = [];
      let size = 0;
      response.on("data", (chunk) => {
        size += chunk.length;
        if (size > maxBytes) {
          response.destroy();
          request.destroy();
          fail(new TransportError("bad_answer", `the answer to ${path} is longer than ${maxBytes} bytes (not read)`));
          return;
        }
        chunks.push(chunk);
      });
      response.on("end", () => {
        done();
        const text = Buffer.concat(chunks).toString("utf8");
        resolve({ status: response.statusCode, headers: response.headers, text });
      });
      response.on("error", fail);
    });
    request.on("error", fail);
    if (target.socket) request.on("socket", (sock) => sock.once("connect", done)); // connected: the fd has served
    request.end(body);
  });
}

/**
 * An agent that opens ONE connection to `url` and keeps it for the proof and the request after it; asked for
 * a second one (the server closed the first after its proof), it refuses: that one could reach another process.
 */
export function proofAgent(url) {
  const Agent = new URL(url).protocol === "https:" ? https.Agent : http.Agent;
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  const connect = agent.createConnection;
  let opened = false;
  agent.createConnection = function (options, callback) {
    if (opened) {
      callback(new TransportError("unreachable", "the server closed the connection after its proof; nothing was " +
        "sent (the token goes only on the connection that proved it)", "ECONNRESET"));
      return undefined;
    }
    opened = true;
    return connect.call(this, options, callback);
  };
  return agent;
}

/**
 * Asks a TCP server to prove it holds `token`, on `agent`'s connection (kept open for the request that
 * follows); TransportError("untrusted") unless it does, before any of its body is read. Sends no token.
 */
export async function requireProof(url, token, { signal, origin, agent }) {
  if (weakToken(token)) {
    throw new TransportError("auth", `the token for ${origin} is too weak to send (${WEAK_TOKEN_RULE}); the ` +
      "daemon does not accept it either: nothing was sent");
  }
  const challenge = randomBytes(32).toString("hex");
  await exchange({ url }, {
    method: "GET",
    path: "/health",
    headers: { "X-Veritas-Challenge": challenge, "X-Veritas-Key-Id": keyId(token), Accept: "application/json" },
    signal,
    agent,
    keepAlive: true,
    maxBytes: HEALTH_BODY_MAX,
    check(response) {
      if (!proven(token, challenge, response.headers["x-veritas-proof"])) {
        throw new TransportError("untrusted", `the server on ${origin.replace(/^https?:\/\//, "")} did not prove ` +
          "it holds the token; another process may be listening there (nothing was sent to it)");
      }
    },
  });
}

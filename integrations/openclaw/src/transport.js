// Reaching the daemon, and knowing it is the daemon (veritas_watch/transport.py says the same in Python):
// - its Unix socket `api.sock` in its data dir (zero config): the first of `socket`/`dataDir`,
//   $VERITAS_WATCH_DATA_DIR, $XDG_STATE_HOME/veritas-watch, ~/.local/state/veritas-watch and
//   /var/lib/veritas-watch (the system service's) that has one. Its directory must be this user's (or
//   root's) and writable by no one else: otherwise another user could have put a socket there;
// - TCP (`url`): anyone may listen on a port first, so before the token (and the person's words) go out the
//   server must prove it holds that token: `GET /health` with a fresh challenge, answered with
//   HMAC-SHA256(token, "veritas-watch server proof\n" + challenge), on every request.

import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { closeSync, lstatSync, openSync, readFileSync, statSync } from "node:fs";
import http from "node:http";
import https from "node:https";
import { homedir } from "node:os";
import { basename, dirname, join } from "node:path";

export const SOCKET_FILE = "api.sock";
export const TOKEN_FILE = "http.token";
const SUN_PATH_MAX = 107; // bytes of a socket path (sockaddr_un.sun_path without its NUL)
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

/** The daemon's local token, from the first candidate data dir that is trusted and has a readable one. */
export function localToken(config, env = process.env, home = homedir()) {
  for (const dir of dataDirCandidates(config, env, home)) {
    if (untrustedBecause(dir)) continue;
    try {
      const token = readFileSync(join(dir, TOKEN_FILE), "utf8").trim();
      if (token) return token;
    } catch {
      // not readable by this user: the next one
    }
  }
  return "";
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
 * One HTTP exchange: `{status, headers, text}`. `target` is `{socket: {dir, name}}` or `{url}`; the request
 * opens its own connection (a socket path through /proc/self/fd when it is longer than a socket path may be).
 */
export function exchange(target, { method, path, headers = {}, body, signal }) {
  return new Promise((resolve, reject) => {
    let dirFd;
    const options = { method, headers: { ...headers, Connection: "close" }, agent: false, signal };
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
    const request = lib.request(options, (response) => {
      const chunks = [];
      response.on("data", (chunk) => chunks.push(chunk));
      response.on("end", () => {
        done();
        resolve({ status: response.statusCode, headers: response.headers, text: Buffer.concat(chunks).toString("utf8") });
      });
      response.on("error", (error) => {
        done();
        reject(error);
      });
    });
    request.on("error", (error) => {
      done();
      reject(error);
    });
    if (target.socket) request.on("socket", (sock) => sock.once("connect", done)); // connected: the fd has served
    request.end(body);
  });
}

/** Asks a TCP server to prove it holds `token`; TransportError("untrusted") unless it does. Sends no token. */
export async function requireProof(url, token, { signal, origin }) {
  const challenge = randomBytes(32).toString("hex");
  const answer = await exchange({ url }, {
    method: "GET",
    path: "/health",
    headers: { "X-Veritas-Challenge": challenge, "X-Veritas-Key-Id": keyId(token), Accept: "application/json" },
    signal,
  });
  if (!proven(token, challenge, answer.headers["x-veritas-proof"])) {
    throw new TransportError("untrusted", `the server on ${origin.replace(/^https?:\/\//, "")} did not prove it ` +
      "holds the token; another process may be listening there (nothing was sent to it)");
  }
}

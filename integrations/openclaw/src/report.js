// One log line per outage, per problem: a daemon that is down for an hour, with agents talking the whole
// time, writes one warning when it goes away and one info line when it answers again. Never a token,
// never a query or a memory: messages name the daemon's origin and the kind of failure only.

const STATE_KEY = Symbol.for("veritas-watch.openclaw-plugin.report-state");

export class Reporter {
  /** `state` is shared by every Reporter built on it: {down: kind | null, said: Set of one-time keys}. */
  constructor(state = { down: null, said: new Set() }) {
    this.state = state;
  }

  /** A failed call: the first failure of an outage is logged, the rest are not. */
  failure(logger, error, what) {
    if (this.state.down) return false;
    this.state.down = error.kind;
    logger.warn(`veritas-watch: ${what} failed: ${error.message}; agents continue without memories ` +
      "until it answers again");
    return true;
  }

  /** A call that worked: ends an outage (one info line). */
  success(logger) {
    if (!this.state.down) return;
    this.state.down = null;
    logger.info("veritas-watch: the daemon answers again; memories are back");
  }

  /** A warning about the setup, said once per process. */
  once(logger, key, message) {
    if (this.state.said.has(key)) return false;
    this.state.said.add(key);
    logger.warn(`veritas-watch: ${message}`);
    return true;
  }
}

/**
 * The reporter of this process. OpenClaw loads the plugin more than once in one gateway (a registry for
 * tool discovery, one for the runtime, one per reload), each a fresh copy of these modules: the state
 * lives on globalThis so all of them share one outage and say each setup problem once.
 */
export const sharedReporter = new Reporter(globalThis[STATE_KEY] ??= { down: null, said: new Set() });

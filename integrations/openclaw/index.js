// OpenClaw plugin entry (ESM, no build step, no dependencies): see src/plugin.js.
import { createPlugin } from "./src/plugin.js";

export default createPlugin();

// Builds the UI into one directory the broker embeds (crates/server/assets/ui): index.html,
// app.js (the pages and uPlot, bundled and minified) and app.css. The same sources and the
// same locked dependency versions (package-lock.json) give the same bytes, so the committed
// build can be checked for staleness: `node build.mjs --out DIR` builds elsewhere to compare.
import * as esbuild from "esbuild";
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const i = process.argv.indexOf("--out");
const out = i > 0 ? process.argv[i + 1] : join(here, "..", "crates", "server", "assets", "ui");
mkdirSync(out, { recursive: true });
await esbuild.build({
  entryPoints: { app: join(here, "src", "app.js") },
  bundle: true,
  minify: true,
  format: "esm",
  target: "es2020",
  legalComments: "eof",
  charset: "utf8",
  outdir: out,
  logLevel: "warning",
});
copyFileSync(join(here, "src", "index.html"), join(out, "index.html"));
console.log(`[ui] built into ${out}`);

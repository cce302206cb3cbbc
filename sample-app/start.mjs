// `npm run sample`: build (or reuse an identical build), then run the app in this process.
import { pathToFileURL } from 'node:url';
import { buildSampleApp } from './build.mjs';

let main;
try {
  ({ main } = await buildSampleApp({ outDir: process.env.SAMPLE_BUILD_DIR, log: (line) => console.error(line) }));
} catch (error) {
  console.error(error instanceof Error ? error.message : String(error));
  process.exit(1);
}
await import(pathToFileURL(main).href);

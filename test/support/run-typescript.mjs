// `node test/support/run-typescript.mjs <file.ts> [args]`: runs a TypeScript entry
// point of this repository in a plain child process (see typescript-hooks.mjs).
import { register } from 'node:module';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

register('./typescript-hooks.mjs', import.meta.url);
const [entry, ...args] = process.argv.slice(2);
process.argv = [process.argv[0], entry, ...args];
await import(pathToFileURL(resolve(entry)).href);

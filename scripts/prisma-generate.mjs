// `node scripts/prisma-generate.mjs`: writes the repository's Prisma clients (the tests', the Prisma example's, the
// bench's), each from its schema into a folder that is not committed, when it is missing or older than the schema:
// offline, a second or two each. `prisma generate` asks for the schema engine, which it would download and does not
// use for a client: any executable stands in for it. Nothing else of Prisma's tooling runs (the tables are made with
// SQL). Run by `npm run typecheck`, the bench's scripts and the tests' global setup.
import { execFileSync } from 'node:child_process';
import { existsSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

/** Each client: where `prisma generate` runs (a prisma.config.ts there is read), its schema, and the client it writes. */
const CLIENTS = [
  { cwd: '.', schema: 'test/prisma/schema.prisma', client: 'test/prisma/generated/client.ts' },
  { cwd: 'examples/prisma', schema: 'prisma/schema.prisma', client: 'src/generated/prisma/client.ts' },
  { cwd: '.', schema: 'bench/prisma/schema.prisma', client: 'bench/prisma/generated/client.ts' },
];

for (const { cwd, schema, client } of CLIENTS) {
  const [schemaPath, clientPath] = [join(root, cwd, schema), join(root, cwd, client)];
  if (existsSync(clientPath) && statSync(clientPath).mtimeMs >= statSync(schemaPath).mtimeMs) continue;
  execFileSync(process.execPath, [join(root, 'node_modules/prisma/build/index.js'), 'generate', '--schema', schema], {
    cwd: join(root, cwd),
    env: {
      ...process.env,
      NODE_OPTIONS: '',
      PRISMA_SCHEMA_ENGINE_BINARY: '/bin/true',
      CHECKPOINT_DISABLE: '1',
      PRISMA_HIDE_UPDATE_MESSAGE: '1',
    },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
}

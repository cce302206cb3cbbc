import { execFileSync } from 'node:child_process';
import { existsSync, statSync } from 'node:fs';
import { join } from 'node:path';

/**
 * Generates the tests' Prisma client from test/prisma/schema.prisma into
 * test/prisma/generated/ (not committed) when it is missing or older than the
 * schema: offline, in a few seconds. `prisma generate` asks for the schema
 * engine, which it would download and does not use for a client: any
 * executable stands in for it. Nothing else of Prisma's tooling runs (the
 * tables are made with SQL). Called by the tests' global setup, with Jest's
 * rootDir (Jest loads it through require(), where `import.meta` is not).
 */
export function generatePrismaClient(root: string): void {
  const schema = join(root, 'test/prisma/schema.prisma');
  const client = join(root, 'test/prisma/generated/client.ts');
  if (existsSync(client) && statSync(client).mtimeMs >= statSync(schema).mtimeMs) return;
  execFileSync(process.execPath, [join(root, 'node_modules/prisma/build/index.js'), 'generate', '--schema', schema], {
    cwd: root,
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

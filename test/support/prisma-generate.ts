import { execFileSync } from 'node:child_process';
import { join } from 'node:path';

/**
 * Generates the repository's Prisma clients (the tests' from test/prisma/schema.prisma into test/prisma/generated/,
 * the Prisma example's, the bench's; none committed) where missing or stale, offline: scripts/prisma-generate.mjs.
 * Called by the tests' global setup, with Jest's rootDir (Jest loads it through require(), where `import.meta` is not).
 */
export function generatePrismaClient(root: string): void {
  execFileSync(process.execPath, [join(root, 'scripts/prisma-generate.mjs')], {
    cwd: root,
    env: { ...process.env, NODE_OPTIONS: '' },
    stdio: ['ignore', 'inherit', 'inherit'],
  });
}

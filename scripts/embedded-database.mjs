import { mkdtemp, rm } from 'node:fs/promises';
import { register } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * An embedded PostgreSQL server for the scripts that need a database when DATABASE_URL is unset (test:package,
 * test:quick-start), with its data in a directory of its own directly under the temp dir: as root the server runs as
 * another user, who must reach it. `stop()` removes the directory.
 *
 * @param name names the database and the data directory
 */
export async function startEmbeddedDatabase(name) {
  register('../test/support/typescript-hooks.mjs', import.meta.url);
  const { startEmbeddedPostgres } = await import('../sample-app/embedded-postgres.ts');
  const dataDir = await mkdtemp(join(tmpdir(), `nest-idempotency-${name}-pg-`));
  console.log(`DATABASE_URL is not set: starting an embedded PostgreSQL server in ${dataDir}`);
  const server = await startEmbeddedPostgres({ dataDir, database: name, persistent: false, log: (line) => console.error(line) });
  return {
    url: server.url,
    stop: async () => {
      await server.stop();
      await rm(dataDir, { recursive: true, force: true });
    },
  };
}

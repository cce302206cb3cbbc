import { randomUUID } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { startEmbeddedPostgres, type EmbeddedDatabase } from '../../sample-app/embedded-postgres.js';
import { keyTableStatements } from './database.js';
import { sleep } from './http.js';

/**
 * A PostgreSQL server of one spec file's own (real binaries, through the
 * `embedded-postgres` package), for what the shared server must not be put
 * through: settings of the test's choosing, a crash, a log read back. Its
 * log (the server's stderr, with PostgreSQL's default logging settings
 * unless `settings` says otherwise) is kept in memory.
 */
export class ThrowawayPostgres {
  private log = '';
  private server?: EmbeddedDatabase;
  private port?: number;

  private constructor(
    private readonly dataDir: string,
    private readonly database: string,
    private readonly settings: Record<string, string>,
  ) {}

  /** Starts a new server with `settings` (`-c name=value`) and a database named `database`. */
  static async start(database: string, settings: Record<string, string> = {}): Promise<ThrowawayPostgres> {
    // The directory itself is the data directory: the package gives it to the `postgres` user when run as root.
    const dataDir = await mkdtemp(join(tmpdir(), `throwaway-pg-${database}-`));
    const server = new ThrowawayPostgres(dataDir, database, settings);
    try {
      await server.restart();
    } catch (error) {
      await server.stop();
      throw error;
    }
    return server;
  }

  /** The URL of `database` (by default the server's own) on this server. */
  url(database = this.database): string {
    const url = new URL(this.server!.url);
    url.pathname = `/${database}`;
    return url.toString();
  }

  /** A plain client on `database`, with `options` (e.g. `-c search_path=...`). */
  async client(database = this.database, options?: string): Promise<pg.Client> {
    const client = new pg.Client({ connectionString: this.url(database), options });
    await client.connect();
    return client;
  }

  /** Creates `schema` afresh, with the key table (see key-table.ts) and the tests' `effects` table in it. */
  async createKeySchema(schema: string, database = this.database): Promise<void> {
    const client = await this.client(database);
    try {
      await client.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await client.query(`CREATE SCHEMA "${schema}"`);
      await client.query(`SET search_path = "${schema}"`);
      for (const statement of keyTableStatements()) await client.query(statement);
      await client.query(`CREATE TABLE effects (
        id bigserial PRIMARY KEY, tenant text NOT NULL, label text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`);
    } finally {
      await client.end();
    }
  }

  /** How much the server has logged so far: where a later `logSince` starts. */
  logOffset(): number {
    return this.log.length;
  }

  /**
   * What the server logged since `offset`, up to now: a line logged at
   * `LOG` level is asked for last, and awaited, so every line that any
   * server process wrote before it (the server processes write to one pipe)
   * has arrived.
   */
  async logSince(offset: number): Promise<string> {
    const marker = `log-read-${randomUUID()}`;
    const client = await this.client();
    try {
      await client.query(`DO $$ BEGIN RAISE LOG '${marker}'; END $$`);
    } finally {
      await client.end();
    }
    for (let i = 0; i < 500 && !this.log.includes(marker, offset); i++) await sleep(10);
    if (!this.log.includes(marker, offset)) throw new Error('The server log never showed the marker line.');
    return this.log.slice(offset, this.log.lastIndexOf('\n', this.log.indexOf(marker, offset)) + 1);
  }

  /**
   * Crashes the server as `pg_ctl stop -m immediate` does: SIGQUIT to the
   * postmaster, whose processes all exit at once, without a checkpoint and
   * without writing what is still in the WAL buffers. The next start
   * recovers from the WAL on disk.
   */
  async crash(): Promise<void> {
    const [pid] = (await readFile(join(this.dataDir, 'postmaster.pid'), 'utf8')).split('\n');
    process.kill(Number(pid), 'SIGQUIT');
    for (let i = 0; i < 500 && alive(Number(pid)); i++) await sleep(10);
    if (alive(Number(pid))) throw new Error(`The postmaster (pid ${pid}) did not exit after SIGQUIT.`);
    // Forgets the exited server (the data directory is kept: persistent).
    await this.server?.stop();
    this.server = undefined;
  }

  /** Starts the server (again) on its data directory and port. */
  async restart(): Promise<void> {
    this.server = await startEmbeddedPostgres({
      dataDir: this.dataDir,
      database: this.database,
      persistent: true,
      port: this.port,
      settings: this.settings,
      serverLog: (text) => (this.log += text),
    });
    this.port = Number(new URL(this.server.url).port);
  }

  /** Stops the server and deletes its data. */
  async stop(): Promise<void> {
    await this.server?.stop();
    this.server = undefined;
    await rm(this.dataDir, { recursive: true, force: true });
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

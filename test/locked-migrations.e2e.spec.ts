import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn, type ChildProcess } from 'node:child_process';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { DataSource } from 'typeorm';
import { CreateIdempotencyKeys1764460800000 } from '../src/index.js';
import { CreateOutboxMessages1764547200000 } from '../src/outbox/index.js';
import { databaseUrl, dataSourceOptions, freshSchema, sqlClient } from './support/database.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const INSTANCES = 4;
const ROUNDS = 2;
const TEST_MIGRATIONS = ['CreateMigrationLog1764600000000', 'LogAgain1764600000001'];
const MODULE_MIGRATIONS = ['CreateIdempotencyKeys1764460800000', 'CreateOutboxMessages1764547200000'];
const ALL_MIGRATIONS = [...MODULE_MIGRATIONS, ...TEST_MIGRATIONS];

/** An app instance as an OS process of its own (test/support/migrating-instance.ts), answering line by line. */
class InstanceProcess {
  private readonly child: ChildProcess;
  private readonly lines: string[] = [];
  private readonly waiting: Array<(line: string | undefined) => void> = [];
  private stderr = '';
  private closed = false;

  constructor(readonly name: string) {
    this.child = spawn(process.execPath, ['test/support/run-typescript.mjs', 'test/support/migrating-instance.ts'], {
      cwd: ROOT,
      // Jest's --experimental-vm-modules is not for the child.
      env: { ...process.env, NODE_OPTIONS: '', DATABASE_URL: databaseUrl(), MIGRATION_INSTANCE: name },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    this.child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (this.stderr += chunk));
    createInterface({ input: this.child.stdout! }).on('line', (line) => {
      // Only the protocol's lines: anything else (TypeORM logs migration failures to stdout) goes with stderr.
      if (!/^(ready|applied |failed )/.test(line)) {
        this.stderr += `${line}\n`;
        return;
      }
      const waiter = this.waiting.shift();
      if (waiter) waiter(line);
      else this.lines.push(line);
    });
    this.child.once('close', () => {
      this.closed = true;
      for (const waiter of this.waiting.splice(0)) waiter(undefined);
    });
  }

  send(line: string): void {
    this.child.stdin!.write(`${line}\n`);
  }

  /** The next line the process prints; throws, with its stderr, if it exits first. */
  async next(): Promise<string> {
    const line =
      this.lines.shift() ?? (this.closed ? undefined : await new Promise<string | undefined>((r) => this.waiting.push(r)));
    if (line === undefined) throw new Error(`${this.name} exited (code ${this.child.exitCode}):\n${this.stderr}`);
    return line;
  }

  async stop(): Promise<void> {
    if (this.closed) return;
    const closed = new Promise((resolve) => this.child.once('close', resolve));
    this.child.stdin!.end();
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 5_000);
    await closed;
    clearTimeout(timer);
  }
}

async function rows(schema: string, sql: string): Promise<Array<Record<string, string>>> {
  const client = await sqlClient(schema);
  try {
    return (await client.query(sql)).rows;
  } finally {
    await client.end();
  }
}

describe('runMigrationsWithLock: instances starting together on a fresh database', () => {
  let instances: InstanceProcess[] = [];
  beforeAll(() => {
    instances = Array.from({ length: INSTANCES }, (_, i) => new InstanceProcess(`instance-${i + 1}`));
  });
  afterAll(async () => {
    await Promise.all(instances.map((instance) => instance.stop()));
  });

  // `empty`: a fresh database, so the instances also race to create TypeORM's migrations table.
  // `upgrade`: the module's migrations ran at an earlier deploy; the instances find the same two pending.
  const rounds = (['all', 'each', 'factory'] as const).flatMap((mode) =>
    (['empty', 'upgrade'] as const).flatMap((database) =>
      Array.from({ length: ROUNDS }, (_, i) => [mode, database, i + 1] as const),
    ),
  );

  it.each(rounds)('%s, %s database, round %i: each migration runs exactly once', async (mode, database, round) => {
    const schema = await freshSchema(`locked_migrations_${mode}_${database}_${round}`);
    if (database === 'upgrade') {
      const earlier = new DataSource({
        ...dataSourceOptions(schema),
        migrations: [CreateIdempotencyKeys1764460800000, CreateOutboxMessages1764547200000],
      });
      await earlier.initialize();
      await earlier.runMigrations().finally(() => earlier.destroy());
    }
    for (const instance of instances) instance.send(`prepare ${schema} ${mode}`);
    expect(await Promise.all(instances.map((instance) => instance.next()))).toEqual(instances.map(() => 'ready'));
    // All connected: the start signal reaches every process at about the same moment.
    for (const instance of instances) instance.send('go');
    const outcomes = await Promise.all(instances.map((instance) => instance.next()));

    // No instance failed (a race shows as "relation ... already exists" or a duplicate key).
    expect(outcomes.filter((outcome) => !outcome.startsWith('applied '))).toEqual([]);
    // Each migration is recorded once and ran once: the non-idempotent one could not have run twice.
    expect((await rows(schema, 'SELECT name FROM migrations ORDER BY id')).map((r) => r.name)).toEqual(ALL_MIGRATIONS);
    const log = await rows(schema, 'SELECT migration, instance FROM migration_log ORDER BY id');
    expect(log.map((r) => r.migration)).toEqual(TEST_MIGRATIONS);
    // One instance applied what was pending (it held the lock for its whole run); the others found nothing.
    expect(new Set(log.map((r) => r.instance)).size).toBe(1);
    const applied = outcomes.map((outcome) => JSON.parse(outcome.slice('applied '.length)) as string[]);
    const pending = mode === 'factory' || database === 'upgrade' ? TEST_MIGRATIONS : ALL_MIGRATIONS;
    expect(applied.filter((list) => list.length > 0)).toEqual([pending]);
    expect(
      await rows(schema, `SELECT to_regclass('idempotency_keys') AS keys, to_regclass('outbox_messages') AS outbox`),
    ).toEqual([{ keys: 'idempotency_keys', outbox: 'outbox_messages' }]);
  });
});

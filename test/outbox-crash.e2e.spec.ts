import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn, type ChildProcess } from 'node:child_process';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type pg from 'pg';
import { createOutboxTable, createTables, databaseUrl, freshSchema, sqlClient } from './support/database.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const MAX_ATTEMPTS = 3;

/** A relay as an OS process of its own (test/support/outbox-relay-instance.ts), driven line by line. */
class RelayProcess {
  /** Every line it printed, in order. */
  readonly output: string[] = [];
  private readonly child: ChildProcess;
  private readonly waiting: Array<{ pattern: RegExp; resolve: (line: string | undefined) => void }> = [];
  private stderr = '';
  private exited = false;

  private constructor(schema: string) {
    this.child = spawn(process.execPath, ['test/support/run-typescript.mjs', 'test/support/outbox-relay-instance.ts'], {
      cwd: ROOT,
      // Jest's --experimental-vm-modules is not for the child.
      env: {
        ...process.env,
        NODE_OPTIONS: '',
        DATABASE_URL: databaseUrl(),
        OUTBOX_SCHEMA: schema,
        OUTBOX_MAX_ATTEMPTS: String(MAX_ATTEMPTS),
      },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    this.child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (this.stderr += chunk));
    createInterface({ input: this.child.stdout! }).on('line', (line) => {
      this.output.push(line);
      const waiter = this.waiting.find((w) => w.pattern.test(line));
      if (!waiter) return;
      this.waiting.splice(this.waiting.indexOf(waiter), 1);
      waiter.resolve(line);
    });
    this.child.once('close', () => {
      this.exited = true;
      for (const waiter of this.waiting.splice(0)) waiter.resolve(undefined);
    });
  }

  static async start(schema: string): Promise<RelayProcess> {
    const relay = new RelayProcess(schema);
    await relay.next(/^ready$/);
    return relay;
  }

  send(line: string): void {
    this.child.stdin!.write(`${line}\n`);
  }

  /** The next line matching `pattern` printed from now on; throws, with its stderr, if the process exits first. */
  async next(pattern: RegExp): Promise<string> {
    const line = this.exited
      ? undefined
      : await new Promise<string | undefined>((resolve) => this.waiting.push({ pattern, resolve }));
    if (line === undefined) throw new Error(`the relay process exited (code ${this.child.exitCode}):\n${this.stderr}`);
    return line;
  }

  /** SIGKILL: no shutdown hook runs, nothing is settled, as when the host dies. */
  async kill(): Promise<void> {
    if (this.exited) return;
    const closed = new Promise((resolve) => this.child.once('close', resolve));
    this.child.kill('SIGKILL');
    await closed;
  }

  async stop(): Promise<void> {
    if (this.exited) return;
    const closed = new Promise((resolve) => this.child.once('close', resolve));
    this.child.stdin!.end();
    // Its handler never settles, so a graceful shutdown would wait for its delivery timeout.
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 5_000);
    await closed;
    clearTimeout(timer);
  }
}

/**
 * A relay that dies while delivering a message leaves it locked but never
 * settled. Each such attempt counts (it was counted when the message was
 * locked), so after `maxAttempts` of them the message is dead-lettered
 * instead of being delivered once more: a message that kills its relay
 * cannot make every relay that takes it over die for ever.
 */
describe('outbox relay processes killed mid-delivery', () => {
  let db: pg.Client;
  const started: RelayProcess[] = [];
  const start = async (schema: string) => {
    const relay = await RelayProcess.start(schema);
    started.push(relay);
    return relay;
  };
  let schema: string;

  beforeAll(async () => {
    schema = await freshSchema('outbox_crash');
    await createTables(schema);
    await createOutboxTable(schema);
    db = await sqlClient(schema);
  });
  afterEach(async () => {
    await Promise.all(started.splice(0).map((relay) => relay.stop()));
  });
  afterAll(async () => {
    await db?.end();
  });

  const row = async (id: string) =>
    (
      await db.query('SELECT status, attempts, last_error, locked_until > now() AS locked FROM outbox_messages WHERE id = $1', [
        id,
      ])
    ).rows[0] as { status: string; attempts: number; last_error: string | null; locked: boolean | null };

  it(`is dead-lettered, not delivered again, after ${MAX_ATTEMPTS} attempts that each killed their relay`, async () => {
    const { rows } = await db.query(`INSERT INTO outbox_messages (topic, payload) VALUES ('email', '{"to":"x"}') RETURNING id`);
    const id = String(rows[0].id);

    for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt++) {
      const relay = await start(schema);
      relay.send('round');
      expect(await relay.next(/^delivering /)).toBe(`delivering ${id} ${attempt}`);
      await relay.kill();
      expect(await row(id)).toMatchObject({ status: 'pending', attempts: attempt, last_error: null, locked: true });
      // The lock would run out after lockTimeout (10 min here); ending it now stands for that wait.
      await db.query('UPDATE outbox_messages SET locked_until = now() WHERE id = $1', [id]);
    }

    const relay = await start(schema);
    relay.send('round');
    // Delivering it again would print a delivery line before the round's report (and hang the round).
    const first = await relay.next(/^(delivering|report) /);
    expect(first).toMatch(/^report /);
    const report = JSON.parse(first.slice('report '.length)) as Record<string, number>;
    expect(report).toMatchObject({ claimed: 1, deadLettered: 1, delivered: 0, retried: 0, lostLocks: 0 });
    expect(relay.output.filter((line) => line.startsWith('delivering'))).toEqual([]);
    expect(relay.output).toContainEqual(
      expect.stringMatching(
        new RegExp(`^log warn Outbox message ${id} \\(email\\) dead-lettered after ${MAX_ATTEMPTS} attempts: `),
      ),
    );
    const dead = await row(id);
    expect(dead).toMatchObject({ status: 'dead', attempts: MAX_ATTEMPTS, locked: null });
    expect(dead.last_error).toMatch(new RegExp(`attempted ${MAX_ATTEMPTS} times .*the last attempt ended without a result`));

    // Dead stays dead: the next round finds nothing to claim.
    relay.send('round');
    expect(JSON.parse((await relay.next(/^report /)).slice('report '.length))).toMatchObject({ claimed: 0 });
    expect(relay.output.filter((line) => line.startsWith('delivering'))).toEqual([]);
    // Four relay processes start one after another, each a Nest application's boot: on a loaded machine that alone
    // passed the default minute once.
  }, 180_000);
});

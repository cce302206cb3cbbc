import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn, type ChildProcess } from 'node:child_process';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { API_KEY } from './support/charges.js';
import { printFigures } from './support/figures.js';
import { Fleet, killOnExit, type SampleProcess } from './support/sample-process.js';
import { ScenarioDatabase } from './support/scenario-database.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const ITEMS = 12;
const KILL_AFTER = 5;
const DELAY_MS = 150;

interface JobLine {
  item: number;
  status: number;
  replayed: boolean;
  attempts: number;
  id?: string;
}

/** One run of test/reliability/client-job.ts; its answers arrive as lines. */
class JobProcess {
  readonly lines: JobLine[] = [];
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  private stderr = '';
  private readonly child: ChildProcess;
  private readonly watchers: Array<() => void> = [];

  constructor(env: Record<string, string>) {
    this.child = spawn(process.execPath, ['test/support/run-typescript.mjs', 'test/reliability/client-job.ts'], {
      cwd: ROOT,
      env: { ...process.env, NODE_OPTIONS: '', ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    killOnExit(this.child);
    this.child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (this.stderr += chunk));
    createInterface({ input: this.child.stdout! }).on('line', (line) => {
      this.lines.push(JSON.parse(line) as JobLine);
      for (const watcher of this.watchers) watcher();
    });
    this.exited = new Promise((resolve) => this.child.once('close', (code, signal) => resolve({ code, signal })));
  }

  /** Resolves once `count` answers were printed (rejects if the job ends first). */
  answered(count: number): Promise<void> {
    return new Promise((resolve, reject) => {
      const check = () => this.lines.length >= count && resolve();
      this.watchers.push(check);
      check();
      void this.exited.then(() =>
        this.lines.length >= count ? resolve() : reject(new Error(`job ended early:\n${this.stderr}`)),
      );
    });
  }

  kill(): Promise<unknown> {
    this.child.kill('SIGKILL');
    return this.exited;
  }

  get errors(): string {
    return this.stderr;
  }
}

/**
 * A batch job killed mid-way and started again, as real processes, against a
 * real sample-app process: with keys from business identity each item is
 * charged once whatever the restart repeats; with keys minted per run, every
 * item the first run reached is charged again.
 */
describe('a batch job using the client, killed mid-way and restarted', () => {
  const fleet = new Fleet();
  let db: ScenarioDatabase;
  let app: SampleProcess;

  beforeAll(async () => {
    db = await ScenarioDatabase.create('client_restarts');
    // A short lease: the restart may meet the killed run's last request in flight and wait for it.
    app = await fleet.start({
      name: 'client-restarts',
      adapter: 'fastify',
      databaseUrl: db.url,
      env: { IDEMPOTENCY_LEASE_MS: '2000' },
    });
  });
  afterAll(async () => {
    await fleet.stopAll();
    await db?.drop();
  });

  const runTwice = async (keys: 'business' | 'per-run') => {
    const env = {
      BASE_URL: app.url,
      API_KEY,
      JOB_ID: `${keys}-${Date.now()}`,
      ITEMS: String(ITEMS),
      DELAY_MS: String(DELAY_MS),
      KEYS: keys,
    };
    const first = new JobProcess(env);
    await first.answered(KILL_AFTER);
    // Half a charge later the next item's request is at the server (each takes DELAY_MS there): the kill lands mid-request.
    await new Promise((resolve) => setTimeout(resolve, DELAY_MS / 2));
    await first.kill();
    const second = new JobProcess(env);
    const exit = await second.exited;
    expect({ exit, errors: second.errors }).toEqual({ exit: { code: 0, signal: null }, errors: '' });
    // The killed run's last request, if the server got it, ended long before: the restart took ITEMS x DELAY_MS.
    const charges = await db.chargesByCustomer();
    const perItem = Array.from({ length: ITEMS }, (_, item) => charges.get(`cus-${env.JOB_ID}-${item}`)?.length ?? 0);
    return { env, first, second, perItem };
  };

  it(`with business keys: ${ITEMS} items, ${ITEMS} charges, the restart replaying what the killed run did`, () =>
    fleet.explain(async () => {
      const { first, second, perItem } = await runTwice('business');
      expect(perItem).toEqual(Array(ITEMS).fill(1));
      const reached = first.lines.length;
      expect(second.lines.map((line) => line.status)).toEqual(Array(ITEMS).fill(201));
      // What the first run saw answered is replayed with the same charge.
      for (const line of first.lines) {
        expect({ item: line.item, replayed: second.lines[line.item].replayed, id: second.lines[line.item].id }).toEqual({
          item: line.item,
          replayed: true,
          id: line.id,
        });
      }
      // Items the first run never reached are new.
      for (const line of second.lines.slice(reached + 1))
        expect({ item: line.item, replayed: line.replayed }).toEqual({ item: line.item, replayed: false });
      printFigures('client/job-restart-business-keys', {
        items: ITEMS,
        'answers before the kill': reached,
        'replays after the restart': second.lines.filter((line) => line.replayed).length,
        'attempts after the restart': second.lines.reduce((sum, line) => sum + line.attempts, 0),
        charges: perItem.reduce((a, b) => a + b, 0),
        duplicates: perItem.filter((count) => count > 1).length,
      });
    }));

  it('with keys minted per run (the wrong pattern): every item the killed run finished is charged twice', () =>
    fleet.explain(async () => {
      const { first, second, perItem } = await runTwice('per-run');
      const reached = first.lines.length;
      expect(second.lines.every((line) => line.status === 201 && !line.replayed)).toBe(true);
      expect(perItem.slice(0, reached)).toEqual(Array(reached).fill(2));
      // The item in flight at the kill: charged again, or once if the kill stopped it before the server acted.
      expect([1, 2]).toContain(perItem[reached]);
      expect(perItem.slice(reached + 1)).toEqual(Array(ITEMS - reached - 1).fill(1));
      printFigures('client/job-restart-keys-per-run', {
        items: ITEMS,
        'answers before the kill': reached,
        charges: perItem.reduce((a, b) => a + b, 0),
        duplicates: perItem.filter((count) => count > 1).length,
      });
    }));
});

import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { startEmbeddedPostgres, type EmbeddedDatabase } from '../../sample-app/embedded-postgres.js';
import { sleep, type RawResponse } from '../support/http.js';
import { ProblemType } from '../../src/index.js';
import { answerLabel, chargeBody, postCharge, problemType, transportFailure, type ChargeBody } from './support/charges.js';
import { CommitCutter } from './support/commit-cutter.js';
import { printFigures, tally } from './support/figures.js';
import { Fleet, type SampleProcess } from './support/sample-process.js';
import { ScenarioDatabase } from './support/scenario-database.js';

const LEASE_MS = 2_000;
const INTENTS = 60;
/** Intents start one after another over the fault window, so every fault meets requests in flight. */
const START_EVERY_MS = 90;
const FAULT_PHASE_MS = 7_000;
const RECOVERY_ATTEMPTS = 30;
const FRESH_INTENTS_AFTER_RECOVERY = 10;
const COMMITS_CUT = 5;
/** The answers a request may get while the database fails: done, someone else holds the key, or outcome unknown. */
const ALLOWED_UNDER_FAULTS = new Set(['201', '201 replayed', '409 conflict', '503 store-unavailable']);

interface Intent {
  index: number;
  key: string;
  body: ChargeBody;
  answers: Array<RawResponse | string>;
  final?: RawResponse;
}

/**
 * Scenario 4: PostgreSQL connections killed (pg_terminate_backend) and the
 * server restarted while requests are in flight. This scenario runs its own
 * embedded PostgreSQL (never the machine's shared server), restarted on the
 * same data directory and port.
 */
describe('database faults', () => {
  const fleet = new Fleet();
  let dataDir: string;
  let server: EmbeddedDatabase | undefined;
  let port: number;
  let db: ScenarioDatabase;
  let instances: SampleProcess[];

  const startServer = async () => {
    server = await startEmbeddedPostgres({ dataDir, database: 'faults', persistent: true, port, log: () => undefined });
    return server;
  };

  beforeAll(async () => {
    dataDir = await mkdtemp(join(tmpdir(), 'reliability-db-faults-'));
    server = await startEmbeddedPostgres({ dataDir, database: 'faults', persistent: true, log: () => undefined });
    port = Number(new URL(server.url).port);
    db = await ScenarioDatabase.create('db_faults', server.url);
    instances = await fleet.startMany(2, {
      name: 'db-faults',
      databaseUrl: db.url,
      env: { IDEMPOTENCY_LEASE_MS: String(LEASE_MS) },
    });
  });
  afterAll(async () => {
    await fleet.stopAll();
    await db?.client.end().catch(() => undefined);
    await server?.stop();
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
  });

  it('connections killed and the server restarted under load: only 201, 409 or 503; no duplicate; every intent ends naming its one charge; no app restart', () =>
    fleet.explain(async () => {
      const run = Date.now();
      const intents: Intent[] = Array.from({ length: INTENTS }, (_, index) => ({
        index,
        key: `db-fault-${run}-${index}`,
        // Handlers of different lengths, so faults land before, during and after commits.
        body: chargeBody(`cus-db-fault-${run}-${index}`, { delayMs: (index * 37) % 400 }),
        answers: [],
      }));

      // Phase 1: traffic while the database fails.
      const started = Date.now();
      const deadline = started + FAULT_PHASE_MS;
      const faults = injectFaults(db.name, () => server!, startServer);
      await Promise.all(
        intents.map(async (intent) => {
          await sleep(intent.index * START_EVERY_MS);
          for (let attempt = 0; Date.now() < deadline; attempt++) {
            const instance = instances[(intent.index + attempt) % instances.length];
            const outcome = await postCharge(instance.url, intent.key, intent.body).catch((error: unknown) =>
              transportFailure(error)!,
            );
            intent.answers.push(outcome);
            if (typeof outcome !== 'string' && outcome.status === 201) return;
            await sleep(300);
          }
        }),
      );
      const faultLog = await faults;

      // Phase 2: the database is back; the same processes, never restarted, recover on their own.
      for (const instance of instances) await instance.waitHealthy(30_000);
      const processesLost = instances.filter((instance) => !instance.alive).length;
      expect(processesLost).toBe(0);
      const observer = await db.connect();
      try {
        const afterFaults = await db.chargesByCustomer(observer);
        await Promise.all(
          intents.map(async (intent) => {
            for (let attempt = 0; attempt < RECOVERY_ATTEMPTS && !intent.final; attempt++) {
              const res = await postCharge(instances[attempt % instances.length].url, intent.key, intent.body);
              if (res.status === 409 || res.status === 503) {
                await sleep(Math.min(1_000, Number(res.headers['retry-after'] ?? 1) * 1_000));
                continue;
              }
              intent.final = res;
            }
          }),
        );
        const charges = await db.chargesByCustomer(observer);

        const phaseOne = intents.flatMap((intent) => intent.answers);
        const transportErrors = phaseOne.filter((answer): answer is string => typeof answer === 'string');
        const labels = phaseOne.filter((answer): answer is RawResponse => typeof answer !== 'string').map(answerLabel);
        expect(transportErrors).toEqual([]);
        expect(labels.filter((label) => !ALLOWED_UNDER_FAULTS.has(label))).toEqual([]);

        let committedUnderUnknownAnswer = 0;
        let settledInRecovery = 0;
        let executedInRecovery = 0;
        for (const intent of intents) {
          const customer = intent.body.customer;
          expect({ customer, chargesAfterFaults: (afterFaults.get(customer) ?? []).length <= 1 }).toEqual({
            customer,
            chargesAfterFaults: true,
          });
          const ids = charges.get(customer) ?? [];
          expect({ customer, final: intent.final?.status, ids: ids.length }).toEqual({ customer, final: 201, ids: 1 });
          // The final answer, fresh or replayed, names the one charge in the database, and so does the stored response.
          expect(intent.final!.json().id).toBe(ids[0]);
          const row = await db.keyRow(intent.key, 'tenant-a', observer);
          expect(JSON.parse((row.response_body as Buffer).toString('utf8')).id).toBe(ids[0]);
          const isFresh = (answer: RawResponse | string) =>
            typeof answer !== 'string' && answer.status === 201 && answer.headers['idempotent-replayed'] === undefined;
          if (!intent.answers.some((answer) => typeof answer !== 'string' && answer.status === 201)) settledInRecovery++;
          if (isFresh(intent.final!)) executedInRecovery++;
          // The one execution that committed answered either a fresh 201 or, outcome unknown, a 503; never a 500.
          if (![...intent.answers, intent.final!].some(isFresh)) committedUnderUnknownAnswer++;
        }

        // Later requests succeed at once on both processes.
        const fresh = await Promise.all(
          Array.from({ length: FRESH_INTENTS_AFTER_RECOVERY }, (_, i) =>
            postCharge(
              instances[i % instances.length].url,
              `db-fault-fresh-${run}-${i}`,
              chargeBody(`cus-db-fault-fresh-${run}-${i}`),
            ),
          ),
        );
        expect(fresh.map((res) => res.status)).toEqual(fresh.map(() => 201));

        const duplicates = countDuplicates(charges);
        expect(duplicates).toBe(0);
        const intentCharges = intents.reduce((sum, intent) => sum + (charges.get(intent.body.customer)?.length ?? 0), 0);
        expect(intentCharges).toBe(INTENTS);
        printFigures('database-faults', {
          intents: INTENTS,
          'requests under faults': phaseOne.length,
          faults: faultLog,
          'answers under faults': tally(labels),
          '500 answers': labels.filter((label) => label.startsWith('500')).length,
          'transport errors': transportErrors.length,
          'intents settled only after recovery': settledInRecovery,
          'of which executed after recovery': executedInRecovery,
          'charges committed by a request answered 503 (replayed later)': committedUnderUnknownAnswer,
          'final answers': tally(intents.map((intent) => answerLabel(intent.final!))),
          charges: intentCharges,
          duplicates,
          'fresh requests after recovery': tally(fresh.map(answerLabel)),
          'app processes lost': processesLost,
        });
      } finally {
        await observer.end();
      }
    }));

  it('the connection lost during COMMIT (outcome unknown to the app): 503, the charge committed, the retry replays it', () =>
    fleet.explain(async () => {
      const cutter = new CommitCutter(port);
      await cutter.start();
      try {
        const throughCutter = new URL(db.url);
        throughCutter.port = String(cutter.port);
        const cut = await fleet.start({
          name: 'commit-cut',
          adapter: 'fastify',
          databaseUrl: throughCutter.toString(),
          env: { IDEMPOTENCY_LEASE_MS: String(LEASE_MS) },
        });
        const observer = await db.connect();
        const run = Date.now();
        const answers: string[] = [];
        let committedUnder503 = 0;
        try {
          for (let i = 0; i < COMMITS_CUT; i++) {
            const key = `commit-cut-${run}-${i}`;
            const body = chargeBody(`cus-commit-cut-${run}-${i}`);
            cutter.arm(1);
            const unknown = await postCharge(cut.url, key, body);
            answers.push(answerLabel(unknown));
            // Outcome unknown to the app: 503 with Retry-After, never a 500 and never a success it cannot vouch for.
            expect(unknown.status).toBe(503);
            expect(problemType(unknown)).toBe(ProblemType.unavailable);
            expect(Number(unknown.headers['retry-after'])).toBeGreaterThanOrEqual(1);
            // It must not tell the client that nothing happened.
            expect(unknown.json().detail).not.toMatch(/not processed/);
            // Yet it committed: the charge and the completed key, whose stored response names it.
            const ids = await db.chargeIds(body.customer, observer);
            expect(ids).toHaveLength(1);
            committedUnder503++;
            const row = await db.keyRow(key, 'tenant-a', observer);
            expect(row.status).toBe('completed');
            expect(JSON.parse((row.response_body as Buffer).toString('utf8')).id).toBe(ids[0]);
            // Retries, on another process and on the same one, replay that charge: no second execution.
            for (const instance of [instances[i % instances.length], cut]) {
              const retry = await postCharge(instance.url, key, body);
              answers.push(answerLabel(retry));
              expect(retry.status).toBe(201);
              expect(retry.headers['idempotent-replayed']).toBe('true');
              expect(retry.json().id).toBe(ids[0]);
            }
            expect(await db.chargeIds(body.customer, observer)).toEqual(ids);
          }
          expect(cutter.cuts).toBe(COMMITS_CUT);
          printFigures('database-faults/commit-outcome-unknown', {
            'commits whose answer was cut': cutter.cuts,
            answers: tally(answers),
            'charges committed by a request answered 503': committedUnder503,
            'customers charged twice': countDuplicates(await db.chargesByCustomer(observer)),
          });
        } finally {
          await observer.end();
        }
      } finally {
        await cutter.stop();
      }
    }));
});

/**
 * The fault timeline, in parallel with the traffic: connections killed every
 * half second, one server restart (fast shutdown, then a start on the same
 * data directory and port) in the middle. Returns what it did, counted.
 */
async function injectFaults(
  database: string,
  current: () => EmbeddedDatabase,
  restart: () => Promise<EmbeddedDatabase>,
): Promise<Record<string, number>> {
  let terminated = 0;
  let kills = 0;
  let restarts = 0;
  const killConnections = async () => {
    const admin = new pg.Client({ connectionString: adminUrl(current().url) });
    await admin.connect();
    try {
      const { rows } = await admin.query<{ count: string }>(
        'SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) AS count FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()',
        [database],
      );
      terminated += Number(rows[0].count);
      kills++;
    } finally {
      await admin.end();
    }
  };
  for (let i = 0; i < 4; i++) {
    await sleep(500);
    await killConnections();
  }
  await sleep(800);
  await current().stop();
  await sleep(300);
  await restart();
  restarts++;
  for (let i = 0; i < 3; i++) {
    await sleep(500);
    await killConnections();
  }
  return { 'connection kills': kills, 'connections terminated': terminated, 'server restarts': restarts };
}

/** The server's maintenance database, so the killer's own connection is never among the victims. */
function adminUrl(url: string): string {
  const admin = new URL(url);
  admin.pathname = '/postgres';
  return admin.toString();
}

/** Customers (intents) with more than one charge. */
function countDuplicates(charges: Map<string, string[]>): number {
  return [...charges.values()].filter((ids) => ids.length > 1).length;
}

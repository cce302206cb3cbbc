import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import pg from 'pg';
import { ProblemType } from '../../src/index.js';
import { answerLabel, chargeBody, isConflictWithRetryAfter, postCharge, problemType } from './support/charges.js';
import { printFigures, tally } from './support/figures.js';
import { OUTRUN_LEASE_MS, outrunLease } from './support/lease-outrun.js';
import { PgBouncer } from './support/pgbouncer.js';
import { Fleet, type AdapterName, type SampleProcess } from './support/sample-process.js';
import { ScenarioDatabase } from './support/scenario-database.js';
import { runStorm } from './support/storm.js';

const INSTANCES = 4;

/**
 * Scenario 6: the sample app's processes reach PostgreSQL only through
 * PgBouncer in transaction pooling, where consecutive transactions of one
 * client connection may run on different server connections and session
 * state leaks between clients. The module uses neither session state nor
 * named prepared statements, so the state table and the storm hold as they
 * do on direct connections.
 */
describe('through PgBouncer in transaction pooling', () => {
  const fleet = new Fleet();
  let db: ScenarioDatabase;
  let bouncer: PgBouncer | undefined;
  const instances: SampleProcess[] = [];

  beforeAll(async () => {
    db = await ScenarioDatabase.create('pgbouncer');
    bouncer = await PgBouncer.start(db.url);
    const adapters: AdapterName[] = ['express', 'fastify'];
    // All at once, against an empty database, through PgBouncer: each runs the start-up migrations, which
    // a transaction-level advisory lock serialises (a session lock would leak across pooled connections).
    instances.push(
      ...(await Promise.all(
        Array.from({ length: INSTANCES }, (_, i) =>
          fleet.start({
            name: `bouncer-${i + 1}`,
            adapter: adapters[i % 2],
            databaseUrl: bouncer!.url,
            // No heartbeat: the takeover scenario needs the slow original's lease to run out.
            env: { IDEMPOTENCY_LEASE_MS: String(OUTRUN_LEASE_MS), IDEMPOTENCY_HEARTBEAT: 'false' },
          }),
        ),
      )),
    );
  });
  afterAll(async () => {
    await fleet.stopAll();
    await bouncer?.stop();
    await db?.drop();
  });

  const explain = <T>(step: () => Promise<T>) =>
    fleet.explain(async () => {
      try {
        return await step();
      } catch (error) {
        if (error && typeof error === 'object' && bouncer) (error as Error).message += `\n${bouncer.logs()}`;
        throw error;
      }
    });

  it('the state table: new 201, byte-identical replay, 409 while in flight, 422 on a changed body', () =>
    explain(async () => {
      const [a, b, c, d] = instances;
      const answers: string[] = [];
      const note = <T extends Parameters<typeof answerLabel>[0]>(res: T) => (answers.push(answerLabel(res)), res);

      const customer = `cus-bouncer-${Date.now()}`;
      const key = `bouncer-${Date.now()}`;
      const body = chargeBody(customer);
      const created = note(await postCharge(a.url, key, body));
      expect(created.status).toBe(201);
      expect(created.headers['idempotent-replayed']).toBeUndefined();
      expect(await db.chargeIds(customer)).toEqual([created.json().id]);

      const replay = note(await postCharge(b.url, key, { ...body }));
      expect(replay.status).toBe(201);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(Buffer.compare(replay.body, created.body)).toBe(0);
      expect(replay.headers.location).toBe(created.headers.location);

      const mismatch = note(await postCharge(c.url, key, { ...body, amount: body.amount + 1 }));
      expect(mismatch.status).toBe(422);
      expect(problemType(mismatch)).toBe(ProblemType.mismatch);
      expect(await db.chargeIds(customer)).toHaveLength(1);

      const slowCustomer = `cus-bouncer-slow-${Date.now()}`;
      const slowKey = `bouncer-slow-${Date.now()}`;
      // Shorter than the lease: in flight, not outrun.
      const slowBody = chargeBody(slowCustomer, { delayMs: 1_500 });
      const slow = postCharge(d.url, slowKey, slowBody);
      expect(await db.waitForUncommittedChargeInserts(1)).toBe(true);
      const conflict = note(await postCharge(a.url, slowKey, slowBody));
      expect({ answer: answerLabel(conflict), withRetryAfter: isConflictWithRetryAfter(conflict) }).toEqual({
        answer: '409 conflict',
        withRetryAfter: true,
      });
      const mismatchInFlight = note(await postCharge(b.url, slowKey, { ...slowBody, amount: 1 }));
      expect(mismatchInFlight.status).toBe(422);
      const done = note(await slow);
      expect(done.status).toBe(201);
      const replayed = note(await postCharge(c.url, slowKey, slowBody));
      expect(replayed.headers['idempotent-replayed']).toBe('true');
      expect(Buffer.compare(replayed.body, done.body)).toBe(0);
      expect(await db.chargeIds(slowCustomer)).toEqual([done.json().id]);
      expect(await db.duplicateCharges()).toBe(0);

      printFigures('pgbouncer/state-table', {
        processes: instances.length,
        'requests sent': answers.length,
        answers: tally(answers),
        charges: (await db.chargeIds(customer)).length + (await db.chargeIds(slowCustomer)).length,
        duplicates: await db.duplicateCharges(),
      });
    }));

  it('takeover after the lease: the slow original is rolled back (409 lease-lost), one effect', () =>
    explain(async () => {
      const figures = await outrunLease(db, instances[0], instances[1]);
      printFigures('pgbouncer/lease-outrun', figures);
    }));

  it(`storm: 200 concurrent identical POST /charges over ${INSTANCES} processes, one charge`, () =>
    explain(async () => {
      const before = await pooledTransactions(bouncer!, db.name);
      const figures = await runStorm('pgbouncer', instances, db);
      const after = await pooledTransactions(bouncer!, db.name);
      // The traffic really went through PgBouncer's transaction pool: every process claimed through it, and the
      // execution's transaction on top. (Not one per request: a duplicate of a key running in the same process
      // is answered from it, without a round trip.)
      expect(after.transactions - before.transactions).toBeGreaterThan(INSTANCES);
      expect(after.serverConnections).toBeLessThanOrEqual(20);
      printFigures('pgbouncer/storm', {
        ...figures,
        'transactions pooled by PgBouncer': after.transactions - before.transactions,
        'PgBouncer server connections': after.serverConnections,
      });
      expect(figures.charges).toBe(1);
      expect(figures.duplicateCharges).toBe(0);
    }));
});

/** Ends the server connection (a PgBouncer one) that still holds the sample's start-up lock, if any; returns how many it ended. */
/** PgBouncer's own counters for `database`, from its admin console. */
async function pooledTransactions(
  bouncer: PgBouncer,
  database: string,
): Promise<{ transactions: number; serverConnections: number }> {
  const url = new URL(bouncer.url);
  url.pathname = '/pgbouncer';
  const admin = new pg.Client({ connectionString: url.toString() });
  await admin.connect();
  try {
    const stats = await admin.query('SHOW STATS');
    const pools = await admin.query('SHOW POOLS');
    const stat = stats.rows.find((row) => row.database === database);
    const pool = pools.rows.find((row) => row.database === database);
    const servers = ['sv_active', 'sv_idle', 'sv_used', 'sv_tested', 'sv_login'].reduce(
      (sum, column) => sum + Number(pool?.[column] ?? 0),
      0,
    );
    return { transactions: Number(stat?.total_xact_count ?? 0), serverConnections: servers };
  } finally {
    await admin.end();
  }
}

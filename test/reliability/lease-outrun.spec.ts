import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { printFigures } from './support/figures.js';
import { OUTRUN_LEASE_MS, outrunLease } from './support/lease-outrun.js';
import { Fleet, type SampleProcess } from './support/sample-process.js';
import { ScenarioDatabase } from './support/scenario-database.js';

/**
 * Scenario 3: a handler slower than its lease on one process; a retry on
 * another process takes the key over once the lease ends, per the database
 * clock. Both executions write a charge row; only the takeover's commits, and
 * the slow original answers 409 lease-lost.
 */
describe('lease outrun across processes', () => {
  const fleet = new Fleet();
  let db: ScenarioDatabase;
  let express: SampleProcess;
  let fastify: SampleProcess;

  beforeAll(async () => {
    db = await ScenarioDatabase.create('lease_outrun');
    // No heartbeat: the slow handler stands for a stalled process, whose lease runs out.
    const env = { IDEMPOTENCY_LEASE_MS: String(OUTRUN_LEASE_MS), IDEMPOTENCY_HEARTBEAT: 'false' };
    [express, fastify] = await fleet.startAll([
      { name: 'outrun-express', adapter: 'express', databaseUrl: db.url, env },
      { name: 'outrun-fastify', adapter: 'fastify', databaseUrl: db.url, env },
    ]);
  });
  afterAll(async () => {
    await fleet.stopAll();
    await db?.drop();
  });

  it.each([
    ['express', 'fastify'],
    ['fastify', 'express'],
  ])('slow original on %s, takeover on %s: one effect, the original rolled back with 409 lease-lost', (slowName, takeoverName) =>
    fleet.explain(async () => {
      const [slow, takeover] = slowName === 'express' ? [express, fastify] : [fastify, express];
      expect(takeoverName).toBe(takeover.adapter);
      const figures = await outrunLease(db, slow, takeover);
      printFigures(`lease-outrun ${slowName} -> ${takeoverName}`, figures);
    }),
  );
});

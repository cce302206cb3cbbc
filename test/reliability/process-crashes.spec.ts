import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { sleep, type RawResponse } from '../support/http.js';
import { answerLabel, chargeBody, isConflictWithRetryAfter, postCharge, transportFailure } from './support/charges.js';
import { printFigures, tally } from './support/figures.js';
import { Fleet, type SampleProcess } from './support/sample-process.js';
import { ScenarioDatabase } from './support/scenario-database.js';

/** Short enough to wait out, long enough that a retry sent right after the crash meets it. */
const LEASE_MS = 3_000;
const MAX_RETRIES = 40;
const RETRY_EVERY_MS = 250;

/**
 * Scenario 2: a process dies with SIGKILL (no shutdown hook, no rollback
 * from the app) (a) in the middle of its handler, after the business insert
 * and before the commit, and (b) right after the commit, before the
 * response leaves. Retries go to another process.
 */
describe('process crashes', () => {
  const fleet = new Fleet();
  let db: ScenarioDatabase;
  let crashMidFlight: SampleProcess;
  let crashAfterCommit: SampleProcess;
  let survivor: SampleProcess;
  let withoutFaultHook: SampleProcess;

  beforeAll(async () => {
    db = await ScenarioDatabase.create('crashes');
    const env = { IDEMPOTENCY_LEASE_MS: String(LEASE_MS), SAMPLE_FAULT_INJECTION: '1' };
    [crashMidFlight, crashAfterCommit, survivor, withoutFaultHook] = await fleet.startAll([
      { name: 'crash-mid-flight', adapter: 'express', databaseUrl: db.url, env },
      { name: 'crash-after-commit', adapter: 'fastify', databaseUrl: db.url, env },
      { name: 'survivor', adapter: 'express', databaseUrl: db.url, env },
      {
        name: 'no-fault-hook',
        adapter: 'fastify',
        databaseUrl: db.url,
        env: { IDEMPOTENCY_LEASE_MS: String(LEASE_MS) },
      },
    ]);
  });
  afterAll(async () => {
    await fleet.stopAll();
    await db?.drop();
  });

  it('(a) SIGKILL after the insert, before the commit: nothing committed; retries on another process get 409 until the lease ends, then one execution', () =>
    fleet.explain(async () => {
      const customer = `cus-mid-flight-${Date.now()}`;
      const key = `crash-mid-flight-${Date.now()}`;
      // Shorter than the lease: this is a crash, not a lease outrun.
      const body = chargeBody(customer, { delayMs: 2_500 });
      const doomed = postCharge(crashMidFlight.url, key, body).catch((error: unknown) => error);

      // The handler has inserted its charge row in the open request transaction.
      expect(await db.waitForUncommittedChargeInserts(1)).toBe(true);
      const insertsBeforeKill = await db.uncommittedChargeInserts();
      expect(insertsBeforeKill).toBe(1);
      expect(await db.chargeIds(customer)).toEqual([]);
      expect(await crashMidFlight.kill('SIGKILL')).toEqual({ code: null, signal: 'SIGKILL' });
      // The client got no response at all: its connection died with the process.
      expect(transportFailure(await doomed)).toMatch(/ECONNRESET|socket hang up/);

      // PostgreSQL sees the connection go and rolls the transaction back: the insert never commits.
      await waitUntil(async () => (await db.uncommittedChargeInserts()) === 0);
      const chargesAfterCrash = await db.chargeIds(customer);
      expect(chargesAfterCrash).toEqual([]);
      const orphaned = await db.keyRow(key);
      expect({ status: orphaned.status, attempt: orphaned.attempt }).toEqual({ status: 'in_flight', attempt: 1 });

      const answers: RawResponse[] = [];
      let final: RawResponse | undefined;
      for (let i = 0; i < MAX_RETRIES && !final; i++) {
        const res = await postCharge(survivor.url, key, body);
        answers.push(res);
        if (res.status === 409) await sleep(RETRY_EVERY_MS);
        else final = res;
      }
      expect(final?.status).toBe(201);
      expect(final?.headers['idempotent-replayed']).toBeUndefined();
      const conflicts = answers.slice(0, -1);
      // The first retry went out right after the crash, long before the lease could end.
      expect(conflicts.length).toBeGreaterThanOrEqual(1);
      expect(conflicts.filter((res) => !isConflictWithRetryAfter(res)).map(answerLabel)).toEqual([]);
      for (const res of conflicts) expect(Number(res.headers['retry-after'])).toBeLessThanOrEqual(Math.ceil(LEASE_MS / 1000));

      const charges = await db.chargeIds(customer);
      expect(charges).toEqual([final!.json().id]);
      const taken = await db.keyRow(key);
      expect({ status: taken.status, attempt: taken.attempt }).toEqual({ status: 'completed', attempt: 2 });
      // Per the database clock, the takeover claimed the key only once the crashed attempt's lease had ended.
      expect(taken.created_at.getTime()).toBeGreaterThanOrEqual(orphaned.lease_expires_at.getTime());

      const replay = await postCharge(withoutFaultHook.url, key, body);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(Buffer.compare(replay.body, final!.body)).toBe(0);
      expect(await db.chargeIds(customer)).toHaveLength(1);

      printFigures('crash-mid-flight', {
        'requests sent': 1 + answers.length + 1,
        'uncommitted inserts seen before the kill': insertsBeforeKill,
        'charges after the crash': chargesAfterCrash.length,
        'retry answers': tally(answers.map(answerLabel)),
        executions: taken.attempt,
        'charges in the end': charges.length,
        duplicates: charges.length - 1,
      });
    }));

  it('(b) SIGKILL after the commit, before the response leaves: the retry without the fault header replays, no second execution', () =>
    fleet.explain(async () => {
      const customer = `cus-after-commit-${Date.now()}`;
      const key = `crash-after-commit-${Date.now()}`;
      const body = chargeBody(customer);
      const crashed = await postCharge(crashAfterCommit.url, key, body, [['X-Fault', 'crash-after-commit']]).catch(
        (error: unknown) => error,
      );
      // The client got no response at all: its connection died with the process.
      const lost = transportFailure(crashed);
      expect(lost).toMatch(/ECONNRESET|socket hang up/);
      expect(await crashAfterCommit.exited).toEqual({ code: null, signal: 'SIGKILL' });

      // It did commit: one charge, and the key completed with the response that names it.
      const committed = await db.chargeIds(customer);
      expect(committed).toHaveLength(1);
      const row = await db.keyRow(key);
      expect({ status: row.status, attempt: row.attempt, response_status: row.response_status }).toEqual({
        status: 'completed',
        attempt: 1,
        response_status: 201,
      });
      expect(JSON.parse((row.response_body as Buffer).toString('utf8')).id).toBe(committed[0]);

      const retry = await postCharge(survivor.url, key, body);
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(retry.json().id).toBe(committed[0]);
      expect(retry.headers.location).toBe(`/charges/${committed[0]}`);
      const again = await postCharge(withoutFaultHook.url, key, body);
      expect(Buffer.compare(again.body, retry.body)).toBe(0);
      const charges = await db.chargeIds(customer);
      expect(charges).toEqual(committed);

      const retries = [retry, again];
      printFigures('crash-after-commit', {
        'requests sent': 1 + retries.length,
        'responses lost to the crash': lost ? 1 : 0,
        'charges committed by the crashed process': committed.length,
        'retry answers': tally(retries.map(answerLabel)),
        'charges in the end': charges.length,
        duplicates: charges.length - 1,
      });
    }));

  it('the fault hook is off unless SAMPLE_FAULT_INJECTION=1: the header does nothing there', () =>
    fleet.explain(async () => {
      const customer = `cus-no-hook-${Date.now()}`;
      const res = await postCharge(withoutFaultHook.url, `no-hook-${Date.now()}`, chargeBody(customer), [
        ['X-Fault', 'crash-after-commit'],
      ]);
      expect(res.status).toBe(201);
      expect(withoutFaultHook.alive).toBe(true);
      expect(await db.chargeIds(customer)).toEqual([res.json().id]);
    }));
});

async function waitUntil(condition: () => Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`Condition not met within ${timeoutMs} ms.`);
    await sleep(20);
  }
}

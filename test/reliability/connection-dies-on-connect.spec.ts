import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { Socket } from 'node:net';
import { LoopbackProxy } from '../support/loopback-proxy.js';
import pg from 'pg';
import { databaseUrl } from '../support/database.js';
import { send, sleep, type RawResponse } from '../support/http.js';
import { chargeBody, postCharge, transportFailure } from './support/charges.js';
import { Fleet, type SampleProcess } from './support/sample-process.js';
import { ScenarioDatabase } from './support/scenario-database.js';

/**
 * A process crash once seen in the database-faults scenario, now pinned.
 *
 * pg-pool hands a NEW client out from inside the socket read that delivered
 * its first ReadyForQuery (`_acquireClient` removes the pool's error listener
 * and calls back synchronously), and TypeORM attaches its own listener only
 * in a promise continuation. If the same read also carries a FATAL (the
 * server terminating that backend: pg_terminate_backend or a shutdown,
 * 57P01), pg emits 'error' on a client with no listener, and Node exits the
 * whole process ("Unhandled 'error' event ... Emitted 'error' event on Client
 * instance"). The proxy below puts the two messages in one read on purpose.
 *
 * The fix, in the sample app's data source options and the README: a
 * permanent error listener on every pooled client before it is handed out,
 * `extra: { onConnect: (client) => client.on('error', () => undefined) }`
 * (pg-pool's onConnect hook runs while its own listener is still attached).
 */
describe("a FATAL in the same read as a new connection's ReadyForQuery", () => {
  const fleet = new Fleet();
  let db: ScenarioDatabase;
  let proxy: FatalAfterReadyProxy;
  let app: SampleProcess;

  beforeAll(async () => {
    db = await ScenarioDatabase.create('repro_fatal_on_new_connection');
    proxy = new FatalAfterReadyProxy(Number(new URL(databaseUrl()).port || 5432));
    await proxy.start();
    const url = new URL(db.url);
    url.hostname = '127.0.0.1';
    url.port = String(proxy.port);
    app = await fleet.start({ name: 'repro', adapter: 'express', databaseUrl: url.toString() });
  });
  afterAll(async () => {
    await fleet.stopAll();
    await proxy?.stop();
    await db?.drop();
  });

  it('does not crash the app: the request fails (503) and the app keeps serving', () =>
    fleet.explain(async () => {
      // Empty the app's pool, so the next request needs a new connection, then make that one die at birth.
      await terminateBackends(db);
      proxy.armed = true;
      const res = await postCharge(app.url, `repro-${Date.now()}`, chargeBody(`cus-repro-${Date.now()}`)).catch(
        (error: unknown) => error,
      );
      const exit = await Promise.race([app.exited, sleep(1_000).then(() => 'still running')]);
      expect(proxy.injected).toBe(1);
      // Fails today with { code: 1, signal: null }: "Unhandled 'error' event" (see the process output in the message).
      expect(exit).toBe('still running');
      expect(transportFailure(res)).toBeUndefined();
      expect((res as RawResponse).status).toBe(503);
      expect((await send(app.url, 'GET', '/health')).status).toBe(200);
    }));
});

async function terminateBackends(db: ScenarioDatabase): Promise<void> {
  const admin = new pg.Client({ connectionString: databaseUrl() });
  await admin.connect();
  try {
    await admin.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1', [db.name]);
  } finally {
    await admin.end();
  }
}

/** ReadyForQuery, idle: 'Z', length 5, 'I'. */
const READY_FOR_QUERY = Buffer.from([0x5a, 0, 0, 0, 5, 0x49]);

/** What a backend sends when it is terminated: ErrorResponse, FATAL 57P01. */
function terminatedByAdministrator(): Buffer {
  const fields = Buffer.from('SFATAL\0VFATAL\0C57P01\0Mterminating connection due to administrator command\0\0');
  const header = Buffer.alloc(5);
  header[0] = 0x45;
  header.writeInt32BE(fields.length + 4, 1);
  return Buffer.concat([header, fields]);
}

/** When armed, the next new connection gets its first ReadyForQuery and a FATAL in one chunk, then is closed. */
class FatalAfterReadyProxy extends LoopbackProxy {
  armed = false;
  injected = 0;

  protected relay(app: Socket, database: Socket): void {
    const doomed = this.armed;
    this.armed = false;
    let ready = false;
    app.on('data', (chunk: Buffer) => database.write(chunk));
    database.on('data', (chunk: Buffer) => {
      if (doomed && !ready && chunk.includes(READY_FOR_QUERY)) {
        ready = true;
        this.injected++;
        app.end(Buffer.concat([chunk, terminatedByAdministrator()]));
        database.destroy();
        return;
      }
      app.write(chunk);
    });
  }
}

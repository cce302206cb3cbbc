import { describe, expect, it } from '@jest/globals';
import pg from 'pg';
import { idempotentPool } from './idempotent-pool.js';

describe('idempotentPool outside idempotent executions', () => {
  it('is a pg.Pool (what PrismaPg checks) with the app pool’s options and counts; ending it ends the app’s pool', async () => {
    const app = new pg.Pool({ connectionString: 'postgres://nobody@127.0.0.1:1/none', max: 3 });
    const pool = idempotentPool(app);

    expect(pool).toBeInstanceOf(pg.Pool);
    expect(pool.options).toMatchObject({ connectionString: 'postgres://nobody@127.0.0.1:1/none', max: 3 });
    (app as unknown as { _clients: unknown[] })._clients.push({});
    expect([pool.totalCount, pool.idleCount, pool.waitingCount]).toEqual([app.totalCount, app.idleCount, app.waitingCount]);
    expect(pool.totalCount).toBe(1);
    (app as unknown as { _clients: unknown[] })._clients.pop();
    await pool.end();
    expect(app.ended).toBe(true);
  });

  it('refuses what is not a pg.Pool of the pg it loads, saying how to fix it', () => {
    expect(() => idempotentPool({ query: () => undefined } as unknown as pg.Pool)).toThrow(/two copies of pg \(npm ls pg\)/);
  });
});

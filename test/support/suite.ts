import { afterAll, beforeAll } from '@jest/globals';
import type pg from 'pg';
import type { IdempotencyModuleOptions } from '../../src/index.js';
import { createTables, freshSchema, sqlClient } from './database.js';
import { startTestApp, type AdapterName, type TestApp } from './test-app.js';

/** The test API booted for one describe block, with a direct client on its schema. */
export interface ApiSuite {
  readonly api: TestApp;
  readonly db: pg.Client;
  /** A label unique to this run, for keys and effect rows. */
  fresh(): string;
  /** Effect rows written under `label`: what actually committed. */
  effects(label: string): Promise<number>;
  keyRow(key: string, tenant?: string): Promise<any>;
}

/** Registers beforeAll/afterAll that boot the test API on `adapter` in a schema of its own. */
export function useApiSuite(adapter: AdapterName, name: string, options: Partial<IdempotencyModuleOptions> = {}): ApiSuite {
  let n = 0;
  const suite = {
    api: undefined as unknown as TestApp,
    db: undefined as unknown as pg.Client,
    fresh: () => `${adapter}-${Date.now()}-${++n}`,
    effects: async (label: string) =>
      Number((await suite.db.query('SELECT count(*) FROM effects WHERE label = $1', [label])).rows[0].count),
    keyRow: async (key: string, tenant = 'tenant-a') =>
      // The latest use of the key (on the partitioned table the rows of earlier, expired uses may still be there).
      (
        await suite.db.query(
          'SELECT * FROM idempotency_keys WHERE tenant_id = $1 AND key = $2 ORDER BY created_at DESC LIMIT 1',
          [tenant, key],
        )
      ).rows[0],
  };
  beforeAll(async () => {
    const schema = await freshSchema(`${name}_${adapter}`);
    await createTables(schema);
    suite.api = await startTestApp(adapter, schema, options);
    suite.db = await sqlClient(schema);
  });
  afterAll(async () => {
    await suite.api?.close();
    await suite.db?.end();
  });
  return suite;
}

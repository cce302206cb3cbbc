import type { INestApplication } from '@nestjs/common';
import type pg from 'pg';
import { loadConfig, type HttpAdapterName } from '../../../sample-app/config.js';
import { createSampleApp } from '../../../sample-app/create-app.js';
import { databaseUrl, freshSchema, sqlClient } from '../../support/database.js';

/** The sample app's default API key for tenant-a. */
export const API_KEY = 'demo-key-tenant-a';

export interface SampleApi {
  app: INestApplication;
  url: string;
  port: number;
  /** A plain client on the app's schema, for counting what committed. */
  db: pg.Client;
  /** Charge ids per customer (each intent of a test has a customer of its own), oldest first. */
  chargesByCustomer(): Promise<Map<string, string[]>>;
  close(): Promise<void>;
}

/** The sample payments API booted in this process, as `main.ts` would, in a schema of its own. */
export async function startSampleApi(
  adapter: HttpAdapterName,
  name: string,
  env: Record<string, string> = {},
): Promise<SampleApi> {
  const schema = await freshSchema(`${name}_${adapter}`);
  const url = databaseUrl();
  const config = loadConfig({ HTTP_ADAPTER: adapter, DATABASE_URL: url, ...env });
  const app = await createSampleApp({ ...config, databaseUrl: url, databaseSchema: schema, logger: false });
  await app.listen(0, '127.0.0.1');
  const appUrl = (await app.getUrl()).replace('[::1]', '127.0.0.1');
  const db = await sqlClient(schema);
  return {
    app,
    url: appUrl,
    port: Number(new URL(appUrl).port),
    db,
    async chargesByCustomer() {
      const { rows } = await db.query<{ customer: string; ids: string[] }>(
        'SELECT customer, array_agg(id ORDER BY created, id) AS ids FROM charges GROUP BY customer',
      );
      return new Map(rows.map((row) => [row.customer, row.ids]));
    },
    async close() {
      await app.close();
      await db.end();
    },
  };
}

import pg from 'pg';
import { databaseUrl } from '../../support/database.js';

/**
 * A database of its own for one scenario, on the server of DATABASE_URL (or
 * another server's URL). The sample app reads only DATABASE_URL, so a
 * dedicated database, not a schema, keeps scenarios apart; the app's
 * migrations create its tables on first start.
 */
export class ScenarioDatabase {
  private constructor(
    readonly name: string,
    readonly url: string,
    private readonly serverUrl: string,
    /** A plain client on the scenario database, for counting what committed. */
    readonly client: pg.Client,
  ) {}

  static async create(name: string, serverUrl = databaseUrl()): Promise<ScenarioDatabase> {
    const database = `reliability_${name.replace(/[^a-z0-9_]/gi, '_').toLowerCase()}`;
    await withAdmin(serverUrl, async (admin) => {
      await admin.query(`DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`);
      await admin.query(`CREATE DATABASE "${database}"`);
    });
    const url = new URL(serverUrl);
    url.pathname = `/${database}`;
    const client = new pg.Client({ connectionString: url.toString() });
    // A server restart (the database-faults scenario) ends this connection; that is not an error of the test.
    client.on('error', () => undefined);
    await client.connect();
    return new ScenarioDatabase(database, url.toString(), serverUrl, client);
  }

  /** A fresh client on the scenario database (after a server restart ended `client`). */
  async connect(): Promise<pg.Client> {
    const client = new pg.Client({ connectionString: this.url });
    client.on('error', () => undefined);
    await client.connect();
    return client;
  }

  /** Charge rows per customer; the scenarios give every intent a customer of its own. */
  async chargesByCustomer(client = this.client): Promise<Map<string, string[]>> {
    const { rows } = await client.query<{ customer: string; ids: string[] }>(
      'SELECT customer, array_agg(id ORDER BY created, id) AS ids FROM charges GROUP BY customer',
    );
    return new Map(rows.map((row) => [row.customer, row.ids]));
  }

  /** Customers (the scenarios' intents) with more than one charge: duplicate effects. */
  async duplicateCharges(client = this.client): Promise<number> {
    const { rows } = await client.query<{ count: string }>(
      'SELECT count(*) FROM (SELECT customer FROM charges GROUP BY customer HAVING count(*) > 1) AS duplicated',
    );
    return Number(rows[0].count);
  }

  async chargeIds(customer: string, client = this.client): Promise<string[]> {
    const { rows } = await client.query<{ id: string }>('SELECT id FROM charges WHERE customer = $1 ORDER BY created, id', [
      customer,
    ]);
    return rows.map((row) => row.id);
  }

  /** The key's row as stored (a raw row), or undefined when absent. */
  async keyRow(key: string, tenant = 'tenant-a', client = this.client): Promise<any> {
    const { rows } = await client.query('SELECT * FROM idempotency_keys WHERE tenant_id = $1 AND key = $2', [tenant, key]);
    return rows[0];
  }

  /**
   * Open transactions of this database whose last statement inserted a
   * charge: handlers that wrote their row and have not committed yet.
   */
  async uncommittedChargeInserts(client = this.client): Promise<number> {
    const { rows } = await client.query<{ count: string }>(
      `SELECT count(*) FROM pg_stat_activity
        WHERE datname = $1 AND pid <> pg_backend_pid() AND state = 'idle in transaction'
          AND query ILIKE 'INSERT INTO "charges"%'`,
      [this.name],
    );
    return Number(rows[0].count);
  }

  /** Polls until `uncommittedChargeInserts()` reaches `count`; false if it did not within `timeoutMs`. */
  async waitForUncommittedChargeInserts(count: number, timeoutMs = 10_000): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if ((await this.uncommittedChargeInserts()) >= count) return true;
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    return false;
  }

  async drop(): Promise<void> {
    await this.client.end().catch(() => undefined);
    await withAdmin(this.serverUrl, (admin) => admin.query(`DROP DATABASE IF EXISTS "${this.name}" WITH (FORCE)`));
  }
}

async function withAdmin<T>(serverUrl: string, work: (admin: pg.Client) => Promise<T>): Promise<T> {
  const admin = new pg.Client({ connectionString: serverUrl });
  await admin.connect();
  try {
    return await work(admin);
  } finally {
    await admin.end();
  }
}

import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { mkdtemp, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { databaseUrl } from './support/database.js';
import { send, type RawResponse } from './support/http.js';
import { MainProcess } from './support/main-process.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');

/** The first TypeScript block under the README's "## Quick start" heading, as a reader would paste it. */
async function quickStartSample(): Promise<string> {
  const readme = await readFile(join(ROOT, 'README.md'), 'utf8');
  const section = readme.slice(readme.indexOf('\n## Quick start\n'));
  const block = /\n```ts\n([\s\S]*?)\n```\n/.exec(section);
  if (!section.startsWith('\n## Quick start') || !block) throw new Error('README.md has no ```ts block under "## Quick start"');
  return block[1];
}

/**
 * The README's Quick start, pasted as it is into a project of its own and run
 * as its own process (its imports of `nest-idempotency-pg` resolve to src/),
 * against a database of its own named by DATABASE_URL, as the README says.
 * A new user's first request must work: no guard, no setup beyond the block.
 */
describe("the README's Quick start, run as pasted", () => {
  const database = `quickstart_${process.pid}_${Date.now()}`;
  let admin: pg.Client;
  let project: string;
  let app: MainProcess | undefined;

  beforeAll(async () => {
    admin = new pg.Client({ connectionString: databaseUrl() });
    await admin.connect();
    await admin.query(`CREATE DATABASE "${database}"`);
    const url = new URL(databaseUrl());
    url.pathname = `/${database}`;

    project = await mkdtemp(join(tmpdir(), 'readme-quick-start-'));
    await writeFile(join(project, 'package.json'), JSON.stringify({ type: 'module' }));
    // The reader's own node_modules would hold the same packages.
    await symlink(join(ROOT, 'node_modules'), join(project, 'node_modules'), 'dir');
    await writeFile(join(project, 'main.ts'), await quickStartSample());

    app = await MainProcess.start('The Quick start', join(project, 'main.ts'), {
      cwd: project,
      env: { DATABASE_URL: url.href },
      probePath: '/charges',
    });
  });

  afterAll(async () => {
    await app?.stop();
    if (project) await rm(project, { recursive: true, force: true });
    if (admin) {
      await admin.query(`DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`);
      await admin.end();
    }
  });

  const postCharge = (key: string | undefined, body: unknown): Promise<RawResponse> =>
    send(app!.baseUrl, 'POST', '/charges', { headers: key === undefined ? [] : [['Idempotency-Key', key]], body });

  async function chargesOf(account: string): Promise<number> {
    const url = new URL(databaseUrl());
    url.pathname = `/${database}`;
    const client = new pg.Client({ connectionString: url.href });
    await client.connect();
    try {
      return Number((await client.query('SELECT count(*) FROM charges WHERE account = $1', [account])).rows[0].count);
    } finally {
      await client.end();
    }
  }

  it('charges once, replays the retry byte for byte, refuses the key with another body and a request without one', async () => {
    const body = { account: 'acct_1', amount: 2500 };
    const first = await postCharge('order-1001', body);
    // With the app's log beside the status, so a failure shows why it answered what it did.
    expect({ status: first.status, output: app!.output }).toEqual({ status: 201, output: expect.any(String) });
    expect(first.json()).toEqual({ id: expect.any(String), account: 'acct_1', amount: 2500 });
    expect(first.headers['idempotent-replayed']).toBeUndefined();

    const retry = await postCharge('order-1001', body);
    expect(retry.status).toBe(201);
    expect(retry.headers['idempotent-replayed']).toBe('true');
    expect(Buffer.compare(retry.body, first.body)).toBe(0);

    expect((await postCharge('order-1001', { ...body, amount: 9900 })).status).toBe(422);
    expect((await postCharge(undefined, body)).status).toBe(400);
    expect(await chargesOf('acct_1')).toBe(1);
  });
});

import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type pg from 'pg';
import { ProblemType } from '../src/index.js';
import { createTables, freshSchema, sqlClient } from './support/database.js';
import { startGraphQLApp, type GraphQLTestApp } from './support/graphql-app.js';
import { send, sleep, type RawResponse } from './support/http.js';
import { ADAPTERS } from './support/test-app.js';
import { CapturingNestLogger } from './real-app/log-capture.js';

const REFUND = `mutation Refund($input: RefundInput!) { refund(input: $input) { id label amount invocation createdAt } }`;

/** `@Idempotent()` on GraphQL mutation resolvers (Apollo), over real HTTP on both adapters. */
describe.each(ADAPTERS)('idempotent GraphQL mutations (%s)', (adapter) => {
  let api: GraphQLTestApp;
  let db: pg.Client;
  let n = 0;
  const fresh = () => `gql-${adapter}-${Date.now()}-${++n}`;
  const effects = async (label: string) =>
    Number((await db.query('SELECT count(*) FROM effects WHERE label = $1', [label])).rows[0].count);
  const keyRow = async (key: string) =>
    (await db.query('SELECT status FROM idempotency_keys WHERE key = $1', [key])).rows[0] as { status: string } | undefined;

  const graphql = (query: string, variables: unknown, key?: string, tenant = 'tenant-a'): Promise<RawResponse> => {
    const headers: Array<[string, string]> = [['X-Tenant', tenant]];
    if (key !== undefined) headers.push(['Idempotency-Key', key]);
    return send(api.url, 'POST', '/graphql', { headers, body: { query, variables } });
  };

  beforeAll(async () => {
    const schema = await freshSchema(`graphql_${adapter}`);
    await createTables(schema);
    db = await sqlClient(schema);
    api = await startGraphQLApp(adapter, schema);
  });
  afterAll(async () => {
    await api?.close();
    await db?.end();
  });

  it('runs the mutation once per key and replays its stored result, marked Idempotent-Replayed', async () => {
    const label = fresh();
    const variables = { input: { label, amount: 500 } };
    const first = await graphql(REFUND, variables, `k-${label}`);
    const second = await graphql(REFUND, variables, `k-${label}`);
    expect(first.status).toBe(200);
    expect(first.json().errors).toBeUndefined();
    expect(first.json().data.refund).toMatchObject({ label, amount: 500, invocation: 1 });
    expect(second.json()).toEqual(first.json());
    expect(second.headers['idempotent-replayed']).toBe('true');
    expect(first.headers['idempotent-replayed']).toBeUndefined();
    expect(api.probe.count(label)).toBe(1);
    expect(await effects(label)).toBe(1);
  });

  it('answers a missing key with a GraphQL error carrying the code, problem type and status, and runs nothing', async () => {
    const label = fresh();
    const res = await graphql(REFUND, { input: { label, amount: 1 } }, undefined);
    const [error] = res.json().errors;
    expect(error.extensions).toMatchObject({ code: 'MISSING_KEY', type: ProblemType.missingKey, status: 400 });
    expect(res.json().data).toBeNull();
    expect(api.probe.count(label)).toBe(0);
  });

  it('answers an invalid key with INVALID_KEY', async () => {
    const res = await graphql(REFUND, { input: { label: fresh(), amount: 1 } }, 'a,b');
    expect(res.json().errors[0].extensions).toMatchObject({ code: 'INVALID_KEY', type: ProblemType.invalidKey });
  });

  it('answers the same key with other arguments with MISMATCH (422), without the stored result', async () => {
    const label = fresh();
    await graphql(REFUND, { input: { label, amount: 500 } }, `k-${label}`);
    const res = await graphql(REFUND, { input: { label, amount: 999 } }, `k-${label}`);
    const body = res.json();
    expect(body.errors[0].extensions).toMatchObject({ code: 'MISMATCH', type: ProblemType.mismatch, status: 422 });
    expect(JSON.stringify(body)).not.toContain('"invocation"');
    expect(api.probe.count(label)).toBe(1);
  });

  it('answers a duplicate while the first runs with CONFLICT (409) and retryAfter, and a Retry-After header', async () => {
    const label = fresh();
    const variables = { input: { label, amount: 5, delayMs: 800 } };
    const first = graphql(REFUND, variables, `k-${label}`);
    while (api.probe.count(label) === 0) await sleep(10);
    const duplicate = await graphql(REFUND, variables, `k-${label}`);
    expect(duplicate.json().errors[0].extensions).toMatchObject({ code: 'CONFLICT', type: ProblemType.conflict, status: 409 });
    expect(duplicate.json().errors[0].extensions.retryAfter).toBeGreaterThanOrEqual(1);
    expect(Number(duplicate.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    expect((await first).json().data.refund.invocation).toBe(1);
    expect(await effects(label)).toBe(1);
  });

  it('scopes the key per tenant', async () => {
    const label = fresh();
    const variables = { input: { label, amount: 5 } };
    await graphql(REFUND, variables, `k-${label}`, 'tenant-a');
    const other = await graphql(REFUND, variables, `k-${label}`, 'tenant-b');
    expect(other.json().data.refund.invocation).toBe(2);
    expect(await effects(label)).toBe(2);
  });

  it('takes the key from an argument when the resolver names one', async () => {
    const label = fresh();
    const query = `mutation ($id: String!, $input: RefundInput!) { refundByArgument(requestId: $id, input: $input) { label invocation } }`;
    const first = await graphql(query, { id: `arg-${label}`, input: { label, amount: 3 } });
    const second = await graphql(query, { id: `arg-${label}`, input: { label, amount: 3 } });
    expect(first.json().data.refundByArgument).toEqual({ label, invocation: 1 });
    expect(second.json()).toEqual(first.json());
    expect(await keyRow(`arg-${label}`)).toEqual({ status: 'completed' });
  });

  it("stores a resolver's GraphQL error as a definite outcome: its writes roll back, the same error replays", async () => {
    const label = fresh();
    const query = `mutation ($input: RefundInput!) { declineRefund(input: $input) { id } }`;
    const first = await graphql(query, { input: { label, amount: 3 } }, `k-${label}`);
    const second = await graphql(query, { input: { label, amount: 3 } }, `k-${label}`);
    expect(first.json().errors[0]).toMatchObject({
      message: 'The charge cannot be refunded.',
      extensions: { code: 'REFUND_DECLINED' },
    });
    expect(second.json()).toEqual(first.json());
    expect(api.probe.count(label)).toBe(1);
    expect(await effects(label)).toBe(0);
  });

  it('keeps the key of an unknown failure in flight until its lease ends, then a retry runs once', async () => {
    const label = fresh();
    const query = `mutation ($input: RefundInput!) { failRefund(input: $input) { id } }`;
    const failed = await graphql(query, { input: { label, amount: 3 } }, `k-${label}`);
    expect(failed.json().errors[0].extensions.code).not.toBe('CONFLICT');
    const during = await graphql(query, { input: { label, amount: 3 } }, `k-${label}`);
    expect(during.json().errors[0].extensions.code).toBe('CONFLICT');
    await sleep(900);
    await graphql(query, { input: { label, amount: 3 } }, `k-${label}`);
    expect(api.probe.count(label)).toBe(2);
    expect(await effects(label)).toBe(0);
  });

  it('keeps the key of an unknown failure in flight on a resolver marked @Idempotent() at class level', async () => {
    const label = fresh();
    const query = `mutation ($label: String!) { failPayout(label: $label) }`;
    const failed = await graphql(query, { label }, `k-${label}`);
    expect(failed.json().errors[0].extensions.code).not.toBe('CONFLICT');
    // The resolver's body ran, so its failure is the handler's (the default policy keeps the key), not a rejection.
    expect(await keyRow(`k-${label}`)).toEqual({ status: 'in_flight' });
    const retry = await graphql(query, { label }, `k-${label}`);
    expect(retry.json().errors[0].extensions.code).toBe('CONFLICT');
    expect(api.probe.count(label)).toBe(1);
    expect(await effects(label)).toBe(0);
  });

  it('releases the key when a pipe rejects the arguments before the resolver runs', async () => {
    const label = fresh();
    const query = `mutation ($input: RefundInput!) { validatedRefund(input: $input) { invocation } }`;
    const rejected = await graphql(query, { input: { label, amount: -1 } }, `k-${label}`);
    expect(rejected.json().errors).toHaveLength(1);
    expect(await keyRow(`k-${label}`)).toBeUndefined();
    const corrected = await graphql(query, { input: { label, amount: 1 } }, `k-${label}`);
    expect(corrected.json().data.validatedRefund).toEqual({ invocation: 1 });
  });
});

/**
 * A client's mistake (no key, a bad key, a reused key, a retry too early) is
 * the client's 4xx, as on an HTTP route: nothing for the server's error log,
 * and certainly no stack trace there. The module logs its own server-side
 * failures itself; the app's own failures stay Nest's to log.
 */
describe.each(ADAPTERS)("what a GraphQL client's mistake leaves in the logs (%s)", (adapter) => {
  let api: GraphQLTestApp;
  const logs = new CapturingNestLogger();
  let n = 0;
  const fresh = () => `gql-logs-${adapter}-${Date.now()}-${++n}`;
  const graphql = (query: string, variables: unknown, key?: string, tenant?: string): Promise<RawResponse> => {
    const headers: Array<[string, string]> = tenant === undefined ? [] : [['X-Tenant', tenant]];
    if (key !== undefined) headers.push(['Idempotency-Key', key]);
    return send(api.url, 'POST', '/graphql', { headers, body: { query, variables } });
  };
  /** The error and warning lines logged since line `from`. */
  const errorLines = (from: number) => logs.lines.slice(from).filter((line) => /^(error|fatal|warn):/.test(line));

  beforeAll(async () => {
    const schema = await freshSchema(`graphql_logs_${adapter}`);
    await createTables(schema);
    api = await startGraphQLApp(adapter, schema, {}, logs);
  });
  afterAll(async () => {
    await api?.close();
  });

  it('logs nothing for a missing key (400), an invalid key (400), a reused key (422) or a duplicate in flight (409)', async () => {
    const label = fresh();
    const before = logs.lines.length;
    const answers = [
      await graphql(REFUND, { input: { label, amount: 1 } }, undefined, 'tenant-a'),
      await graphql(REFUND, { input: { label, amount: 1 } }, 'a,b', 'tenant-a'),
    ];
    await graphql(REFUND, { input: { label, amount: 1 } }, `k-${label}`, 'tenant-a');
    answers.push(await graphql(REFUND, { input: { label, amount: 2 } }, `k-${label}`, 'tenant-a'));
    const slowInput = { input: { label: `${label}-slow`, amount: 1, delayMs: 800 } };
    const slow = graphql(REFUND, slowInput, `slow-${label}`, 'tenant-a');
    while (api.probe.count(`${label}-slow`) === 0) await sleep(10);
    answers.push(await graphql(REFUND, slowInput, `slow-${label}`, 'tenant-a'));
    expect((await slow).json().data.refund.invocation).toBe(1);

    expect(answers.map((res) => res.json().errors[0].extensions.code)).toEqual([
      'MISSING_KEY',
      'INVALID_KEY',
      'MISMATCH',
      'CONFLICT',
    ]);
    expect(errorLines(before)).toEqual([]);
  });

  it("logs a resolver's stored GraphQL error as Nest logs any resolver error the first time, and nothing for its replay", async () => {
    const label = fresh();
    const decline = `mutation ($input: RefundInput!) { declineRefund(input: $input) { id } }`;
    const first = logs.lines.length;
    await graphql(decline, { input: { label, amount: 1 } }, `k-${label}`, 'tenant-a');
    // With the resolver's stack (test/support/graphql-app.ts), as Nest logs it without the module.
    expect(
      errorLines(first).some((line) => line.includes('The charge cannot be refunded.') && line.includes('graphql-app.ts')),
    ).toBe(true);
    const replayed = logs.lines.length;
    const replay = await graphql(decline, { input: { label, amount: 1 } }, `k-${label}`, 'tenant-a');
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.json().errors[0].extensions.code).toBe('REFUND_DECLINED');
    expect(errorLines(replayed)).toEqual([]);
  });

  it("logs a server-side failure of the module once, as the module's own line without a stack; the app's own failure as Nest does", async () => {
    const before = logs.lines.length;
    // No X-Tenant: the resolver finds no tenant, the module's 500 (fail closed).
    const unresolved = await graphql(REFUND, { input: { label: fresh(), amount: 1 } }, `k-${fresh()}`);
    expect(unresolved.json().errors[0].extensions).toMatchObject({ code: 'TENANT_UNRESOLVED', status: 500 });
    const lines = errorLines(before);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/^error: The tenant resolver returned nothing for RefundsResolver\.refund\..* Idempotency$/);

    // The control: an error of the resolver itself is a server error, and Nest logs it with its stack.
    const failed = logs.lines.length;
    const fail = `mutation ($input: RefundInput!) { failRefund(input: $input) { id } }`;
    await graphql(fail, { input: { label: fresh(), amount: 1 } }, `k-${fresh()}`, 'tenant-a');
    expect(
      errorLines(failed).some(
        (line) => line.includes('the payment provider exploded') && /\n\s+at /.test(line) && line.endsWith('ExceptionsHandler'),
      ),
    ).toBe(true);
  });
});

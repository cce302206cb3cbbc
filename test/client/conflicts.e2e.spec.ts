import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, ConflictException, Controller, Module, Post, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { TypeOrmModule } from '@nestjs/typeorm';
import { randomUUID } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { IdempotentClient, type FetchFunction } from '../../src/client/index.js';
import { ProblemType } from '../../src/core/protocol.js';
import { Idempotent, IdempotencyModule } from '../../src/index.js';
import { createTables, dataSourceOptions, freshSchema } from '../support/database.js';

/** A client that retries at once (no backoff to wait out) and has budget enough for every test. */
const quickClient = (baseUrl: string, fetch?: FetchFunction) =>
  new IdempotentClient({ baseUrl, initialDelay: 1, maxDelay: 1, maxAttempts: 3, budget: { minRetries: 1_000 }, fetch });

/**
 * A 409 is retried only when it is the module's own: "another attempt holds
 * the key" or "this attempt lost its lease", told apart by the problem `type`.
 * Any other 409 is the application's answer about the request (the order
 * exists already): the same request with the same key can only get it again.
 */
describe('the client and 409 answers', () => {
  describe('each kind of 409 body, from a plain HTTP server that answers 201 to the next attempt', () => {
    let server: Server;
    let baseUrl: string;
    /** The 409 body each path answers first, then 201; and the attempts each path received. */
    const first = new Map<string, { contentType: string; body: string }>();
    const received = new Map<string, number>();

    beforeAll(async () => {
      server = createServer((request, response) => {
        const path = request.url ?? '/';
        const n = (received.get(path) ?? 0) + 1;
        received.set(path, n);
        request.resume().on('end', () => {
          const conflict = first.get(path);
          if (n === 1 && conflict) {
            response.writeHead(409, { 'content-type': conflict.contentType, 'retry-after': '0' }).end(conflict.body);
          } else response.writeHead(201, { 'content-type': 'application/json' }).end('{"created":true}');
        });
      });
      await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
      baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    });
    afterAll(async () => {
      await new Promise((resolve) => server.close(resolve));
    });

    const problem = (type: string) =>
      JSON.stringify({ type, title: 'Request in progress', status: 409, detail: 'Another request with this key is running.' });
    const cases: Array<[string, { contentType: string; body: string }, boolean]> = [
      ["the module's conflict problem", { contentType: 'application/problem+json', body: problem(ProblemType.conflict) }, true],
      [
        "the module's lease-lost problem",
        { contentType: 'application/problem+json', body: problem(ProblemType.leaseLost) },
        true,
      ],
      [
        "an application's own problem",
        { contentType: 'application/problem+json', body: problem('https://shop.example/problems/duplicate-order') },
        false,
      ],
      [
        "another of the module's problem types",
        { contentType: 'application/problem+json', body: problem(ProblemType.mismatch) },
        false,
      ],
      [
        "Nest's default ConflictException body",
        { contentType: 'application/json', body: '{"statusCode":409,"message":"Order exists","error":"Conflict"}' },
        false,
      ],
      ['a JSON body that is not an object', { contentType: 'application/json', body: 'null' }, false],
      ['a body that is not JSON', { contentType: 'text/plain', body: 'Conflict' }, false],
    ];

    it.each(cases.map(([name, conflict, retried]) => ({ name, conflict, retried })))(
      '$name: retried $retried',
      async ({ conflict, retried }) => {
        const path = `/orders/${randomUUID()}`;
        first.set(path, conflict);
        const answer = await quickClient(baseUrl).post(path, { orderId: 42 });
        if (retried) {
          expect({ status: answer.status, attempts: answer.attempts, received: received.get(path) }).toEqual({
            status: 201,
            attempts: 2,
            received: 2,
          });
        } else {
          expect({
            status: answer.status,
            attempts: answer.attempts,
            received: received.get(path),
            gaveUp: answer.gaveUp,
          }).toEqual({
            status: 409,
            attempts: 1,
            received: 1,
            gaveUp: undefined,
          });
          expect(answer.text()).toBe(conflict.body);
        }
      },
    );
  });

  describe('against a Nest app with @Idempotent() routes', () => {
    let app: INestApplication;
    let baseUrl: string;
    const orders = new Set<number>();
    const runs = new Map<string, number>();
    let releaseSlow!: () => void;
    let slowStarted!: () => void;
    const slowRunning = new Promise<void>((resolve) => (slowStarted = resolve));

    @Controller()
    class OrdersController {
      @Post('orders')
      @Idempotent()
      create(@Body() body: { orderId: number }) {
        runs.set('orders', (runs.get('orders') ?? 0) + 1);
        // The application's own 409: this order exists, whatever key the request carries.
        if (orders.has(body.orderId)) throw new ConflictException(`Order ${body.orderId} already exists.`);
        orders.add(body.orderId);
        return { orderId: body.orderId };
      }

      @Post('slow-orders')
      // A short lease: the 409's Retry-After (the rest of the lease) fits in the client's deadline.
      @Idempotent({ lease: 2_000 })
      async slow(@Body() body: { orderId: number }) {
        runs.set('slow-orders', (runs.get('slow-orders') ?? 0) + 1);
        slowStarted();
        await new Promise<void>((resolve) => (releaseSlow = resolve));
        return { orderId: body.orderId };
      }
    }

    beforeAll(async () => {
      const schema = await freshSchema('client_conflicts');
      await createTables(schema);
      @Module({
        imports: [
          TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }),
          IdempotencyModule.forRoot({ tenant: () => 'tenant-a', sweep: false }),
        ],
        controllers: [OrdersController],
      })
      class ConflictsModule {}
      app = await NestFactory.create(ConflictsModule, { logger: false });
      await app.listen(0, '127.0.0.1');
      baseUrl = (await app.getUrl()).replace('[::1]', '127.0.0.1');
    });
    afterAll(async () => {
      releaseSlow?.();
      await app?.close();
    });

    it("returns the application's 409 as the answer, after one attempt, without running the handler again", async () => {
      const client = quickClient(baseUrl);
      expect((await client.post('/orders', { orderId: 7 })).status).toBe(201);
      // Another intent (a new key) for the same order: the application refuses it.
      const refused = await client.post('/orders', { orderId: 7 });
      expect({ status: refused.status, attempts: refused.attempts, replayed: refused.replayed }).toEqual({
        status: 409,
        attempts: 1,
        replayed: false,
      });
      expect(refused.json()).toMatchObject({ statusCode: 409, message: 'Order 7 already exists.' });
      expect(runs.get('orders')).toBe(2);
    });

    it("retries the module's 409 (the key is held by an attempt in flight) after its Retry-After, then gets the outcome", async () => {
      const key = `slow-${randomUUID()}`;
      const first = fetch(`${baseUrl}/slow-orders`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': key },
        body: JSON.stringify({ orderId: 8 }),
      });
      await slowRunning;
      // The same intent again, while the first attempt holds the key; it completes once the client has met the 409.
      const statuses: number[] = [];
      const observed: FetchFunction = async (input, init) => {
        const response = await fetch(input, init);
        statuses.push(response.status);
        if (response.status === 409) releaseSlow();
        return response;
      };
      const answer = await new IdempotentClient({ baseUrl, maxAttempts: 3, budget: { minRetries: 1_000 }, fetch: observed }).post(
        '/slow-orders',
        { orderId: 8 },
        { key },
      );
      expect((await first).status).toBe(201);
      expect(statuses).toEqual([409, 201]);
      expect({ status: answer.status, attempts: answer.attempts, replayed: answer.replayed }).toEqual({
        status: 201,
        attempts: 2,
        replayed: true,
      });
      expect(runs.get('slow-orders')).toBe(1);
    });
  });
});

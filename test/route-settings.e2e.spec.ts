import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Module, Post, Res, Sse, type DynamicModule, type MessageEvent, type Type } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { TypeOrmModule } from '@nestjs/typeorm';
import { of, type Observable } from 'rxjs';
import { Idempotent, IdempotencyConfigurationError, IdempotencyModule } from '../src/index.js';
import { createTables, dataSourceOptions, freshSchema, sqlClient } from './support/database.js';
import { post, sleep } from './support/http.js';
import { ADAPTERS, type AdapterName } from './support/test-app.js';

/** Boots an app with `controllers` (listening, so start-up runs in full); the caller closes it. */
async function boot(adapter: AdapterName, schema: string, controllers: Type[]) {
  @Module({
    imports: [
      TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }),
      IdempotencyModule.forRoot({ tenant: () => 'tenant-a', sweep: false }),
    ],
    controllers,
  })
  class AppModule {}
  const app = await NestFactory.create(AppModule, adapter === 'express' ? new ExpressAdapter() : new FastifyAdapter(), {
    logger: false,
    abortOnError: false,
  });
  try {
    await app.listen(0, '127.0.0.1');
  } catch (error) {
    await app.close().catch(() => undefined);
    throw error;
  }
  return { app, url: (await app.getUrl()).replace('[::1]', '127.0.0.1') };
}

describe('route settings are checked for every route at start-up (CONTRACT A6.13)', () => {
  let schema: string;
  beforeAll(async () => {
    schema = await freshSchema('route_settings');
    await createTables(schema);
  });

  @Controller('raw')
  class RawResponseController {
    @Post()
    @Idempotent()
    create(@Res() res: unknown) {
      return res;
    }
  }

  @Controller('events')
  class EventsController {
    @Sse()
    @Idempotent()
    events(): Observable<MessageEvent> {
      return of({ data: 'tick' } as MessageEvent);
    }
  }

  @Controller('unitless')
  class UnitlessLeaseController {
    @Post()
    @Idempotent({ lease: '30' })
    create() {
      return {};
    }
  }

  @Controller('bad-policy')
  @Idempotent({ onError: 'retry' as never })
  class BadPolicyController {
    @Post()
    create() {
      return {};
    }
  }

  it.each([
    [
      RawResponseController,
      /RawResponseController\.create cannot be replayed: it writes the response itself through @Res\(\).*passthrough: true/s,
    ],
    [EventsController, /EventsController\.events cannot be replayed: it is a server-sent events stream/],
    [UnitlessLeaseController, /UnitlessLeaseController\.create: lease must be .* with its unit such as '30s'/],
    [BadPolicyController, /BadPolicyController\.create: onError must be 'store', 'release' or 'keep'/],
  ])('%p stops the app before it serves anything, saying how to fix it', async (controller, message) => {
    const started = boot('express', schema, [controller]);
    await expect(started).rejects.toBeInstanceOf(IdempotencyConfigurationError);
    await expect(started).rejects.toThrow(message);
  });

  it('reports every misconfigured route at once', async () => {
    const started = boot('express', schema, [UnitlessLeaseController, BadPolicyController]);
    await expect(started).rejects.toThrow(/2 routes are misconfigured:[\s\S]*UnitlessLeaseController[\s\S]*BadPolicyController/);
  });
});

describe.each(ADAPTERS)('@Idempotent() without IdempotencyModule over %s (CONTRACT A6.13)', (adapter) => {
  @Controller('charges')
  class ChargesController {
    @Post()
    @Idempotent()
    create() {
      return {};
    }
  }

  async function start(imports: Array<Type | DynamicModule>) {
    @Module({ imports, controllers: [ChargesController] })
    class AppModule {}
    const app = await NestFactory.create(AppModule, adapter === 'express' ? new ExpressAdapter() : new FastifyAdapter(), {
      logger: false,
      abortOnError: false,
    });
    await app.close();
  }

  it('stops the app at start-up, saying to import IdempotencyModule.forRoot()', async () => {
    const started = start([]);
    await expect(started).rejects.toBeInstanceOf(IdempotencyConfigurationError);
    await expect(started).rejects.toThrow(
      /@Idempotent\(\) is used, but IdempotencyModule is not set up in this app\. Import IdempotencyModule\.forRoot\(/,
    );
  });
});

describe.each(ADAPTERS)('a TTL shorter than the lease over %s (CONTRACT A4.10)', (adapter) => {
  let schema: string;
  let app: Awaited<ReturnType<typeof boot>>;

  @Controller('short-ttl')
  class ShortTtlController {
    runs = 0;
    @Post()
    @Idempotent({ ttl: 300 })
    async create(@Body() body: { delayMs: number }) {
      this.runs++;
      await sleep(body.delayMs);
      return { run: this.runs };
    }
  }

  beforeAll(async () => {
    schema = await freshSchema(`short_ttl_${adapter}`);
    await createTables(schema);
    app = await boot(adapter, schema, [ShortTtlController]);
  });
  afterAll(() => app?.app.close());

  it('boots; a request outliving its TTL keeps its key (409) until it ends; the response is then kept for the TTL', async () => {
    const key = `ttl-${adapter}-${Date.now()}`;
    // The handler runs 600 ms: twice the TTL, well within the 30 s lease.
    const first = post(app.url, '/short-ttl', { delayMs: 600 }, key);
    await sleep(450);
    const during = await post(app.url, '/short-ttl', { delayMs: 600 }, key);
    expect(during.status).toBe(409);
    expect((await first).status).toBe(201);
    const replay = await post(app.url, '/short-ttl', { delayMs: 600 }, key);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.json()).toEqual({ run: 1 });
    const db = await sqlClient(schema);
    try {
      await db.query(`UPDATE idempotency_keys SET expires_at = now() - interval '1 millisecond' WHERE key = $1`, [key]);
    } finally {
      await db.end();
    }
    const afterExpiry = await post(app.url, '/short-ttl', { delayMs: 0 }, key);
    expect(afterExpiry.status).toBe(201);
    expect(afterExpiry.headers['idempotent-replayed']).toBeUndefined();
    expect(afterExpiry.json()).toEqual({ run: 2 });
  });
});

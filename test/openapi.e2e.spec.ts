import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Get, Module, Param, Post, Version, VersioningType, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { ApiConflictResponse, ApiCreatedResponse, ApiProperty, DocumentBuilder, SwaggerModule } from '@nestjs/swagger';
import { TypeOrmModule } from '@nestjs/typeorm';
import fc from 'fast-check';
import { parseIdempotencyKey } from '../src/core/key.js';
import { Idempotent, IdempotencyModule, ProblemType, SkipIdempotency } from '../src/index.js';
import { applyIdempotencyToOpenApi, IDEMPOTENCY_PROBLEM_SCHEMA, IdempotencyOpenApiModule } from '../src/openapi/index.js';
import { BARE_KEY_PATTERN } from '../src/openapi/apply-idempotency.js';
import { loadConfig } from '../sample-app/config.js';
import { createSampleApp } from '../sample-app/create-app.js';
import { createTables, databaseUrl, dataSourceOptions, freshSchema } from './support/database.js';
import { send } from './support/http.js';
import { ADAPTERS, type AdapterName } from './support/test-app.js';

const MAX_KEY_LENGTH = 64;
const PROBLEM_REF = { $ref: `#/components/schemas/${IDEMPOTENCY_PROBLEM_SCHEMA}` };

class ChargeView {
  @ApiProperty() id!: string;
  @ApiProperty() amount!: number;
}

@Controller('charges')
class ChargesController {
  @Post()
  @Idempotent()
  create() {
    return { id: 'ch_1' };
  }

  @Post('optional')
  @Idempotent({ required: false, ttl: '1h' })
  optional() {
    return { id: 'ch_2' };
  }

  @Post('documented')
  @Idempotent()
  @ApiCreatedResponse({ description: 'The charge', type: ChargeView })
  @ApiConflictResponse({ description: 'The app says 409 too' })
  documented() {
    return { id: 'ch_3' };
  }

  @Post('versioned')
  @Version('2')
  @Idempotent()
  versioned() {
    return { id: 'ch_4' };
  }

  @Get(':id')
  find(@Param('id') id: string) {
    return { id };
  }
}

@Controller('orders')
@Idempotent()
class OrdersController {
  @Post()
  create() {
    return { id: 'or_1' };
  }

  @Post('quote')
  @SkipIdempotency()
  quote() {
    return { price: 1 };
  }
}

/** An app with a global prefix and URI versioning, so operations sit where only Swagger knows. */
async function createApp(adapter: AdapterName, schema: string): Promise<INestApplication> {
  @Module({
    imports: [
      TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }),
      IdempotencyModule.forRoot({ tenant: () => 'openapi', sweep: false, maxKeyLength: MAX_KEY_LENGTH }),
      IdempotencyOpenApiModule,
    ],
    controllers: [ChargesController, OrdersController],
  })
  class OpenApiTestModule {}
  const app =
    adapter === 'express'
      ? await NestFactory.create(OpenApiTestModule, new ExpressAdapter(), { logger: false, abortOnError: false })
      : await NestFactory.create(OpenApiTestModule, new FastifyAdapter(), { logger: false, abortOnError: false });
  app.setGlobalPrefix('api');
  app.enableVersioning({ type: VersioningType.URI, defaultVersion: '1' });
  return app;
}

const generate = (app: INestApplication) => SwaggerModule.createDocument(app, new DocumentBuilder().setTitle('t').build());

describe.each(ADAPTERS)('OpenAPI over %s', (adapter) => {
  let app: INestApplication;
  let url: string;
  let document: any;

  beforeAll(async () => {
    const schema = await freshSchema(`openapi_${adapter}`);
    await createTables(schema);
    app = await createApp(adapter, schema);
    document = applyIdempotencyToOpenApi(generate(app));
    SwaggerModule.setup('docs', app, document);
    await app.listen(0, '127.0.0.1');
    url = (await app.getUrl()).replace('[::1]', '127.0.0.1');
  });
  afterAll(async () => {
    await app?.close();
  });

  const operation = (path: string, method = 'post') => {
    const op = document.paths[path]?.[method];
    if (!op) throw new Error(`no ${method} ${path} in ${Object.keys(document.paths).join(', ')}`);
    return op;
  };
  const keyHeader = (op: any) =>
    (op.parameters ?? []).find((p: any) => p.in === 'header' && p.name.toLowerCase() === 'idempotency-key');

  it('documents the key header of an idempotent route: required, 1 to maxKeyLength visible ASCII', () => {
    expect(keyHeader(operation('/api/v1/charges'))).toMatchObject({
      name: 'Idempotency-Key',
      in: 'header',
      required: true,
      schema: { type: 'string', minLength: 1, maxLength: MAX_KEY_LENGTH, pattern: BARE_KEY_PATTERN },
    });
    expect(keyHeader(operation('/api/v1/charges')).description).toContain('for 1 day;');
  });

  it("follows the route's resolved options: required: false and its own TTL", () => {
    const header = keyHeader(operation('/api/v1/charges/optional'));
    expect(header.required).toBe(false);
    expect(header.description).toContain('for 1 hour;');
    // Without a required key there is no "missing key" 400, only the malformed ones.
    const examples = operation('/api/v1/charges/optional').responses['400'].content['application/problem+json'].examples;
    expect(Object.values(examples).map((e: any) => e.value.type)).toEqual([
      ProblemType.invalidKey,
      ProblemType.unrepresentableBody,
    ]);
  });

  it("documents the module's 400, 409, 422 and 503 as problem+json, Retry-After on 409 and 503", () => {
    const { responses } = operation('/api/v1/charges');
    for (const status of ['400', '409', '422', '503']) {
      expect(responses[status].content['application/problem+json'].schema).toEqual(PROBLEM_REF);
      expect(responses[status].description).not.toBe('');
      expect(responses[status].headers?.['Idempotent-Replayed']).toBeUndefined();
    }
    expect(responses['409'].headers['Retry-After'].schema).toEqual({ type: 'integer', minimum: 1 });
    expect(responses['503'].headers['Retry-After'].schema).toEqual({ type: 'integer', minimum: 1 });
    expect(responses['400'].headers?.['Retry-After']).toBeUndefined();
    expect(responses['422'].headers?.['Retry-After']).toBeUndefined();
    const types = (status: string) =>
      Object.values(responses[status].content['application/problem+json'].examples).map((e: any) => e.value.type);
    expect(types('400')).toEqual([ProblemType.missingKey, ProblemType.invalidKey, ProblemType.unrepresentableBody]);
    expect(types('409')).toEqual([ProblemType.conflict, ProblemType.leaseLost]);
    expect(types('422')).toEqual([ProblemType.mismatch]);
    expect(types('503')).toEqual([ProblemType.unavailable]);
  });

  it('keeps the success response Swagger infers and marks it as possibly replayed', () => {
    const created = operation('/api/v1/charges').responses['201'];
    expect(created.description).toBe('');
    expect(created.headers['Idempotent-Replayed']).toEqual({
      description: expect.any(String),
      schema: { type: 'string', enum: ['true'] },
    });
  });

  it("keeps the app's own responses and adds the problem content beside them", () => {
    const { responses } = operation('/api/v1/charges/documented');
    expect(responses['201'].description).toBe('The charge');
    expect(responses['201'].content['application/json'].schema).toEqual({ $ref: '#/components/schemas/ChargeView' });
    expect(responses['201'].headers['Idempotent-Replayed']).toBeDefined();
    expect(responses['409'].description).toBe('The app says 409 too');
    expect(responses['409'].content['application/problem+json'].schema).toEqual(PROBLEM_REF);
    expect(responses['409'].headers['Retry-After']).toBeDefined();
  });

  it('adds the problem schema once, as RFC 9457 describes it', () => {
    expect(document.components.schemas[IDEMPOTENCY_PROBLEM_SCHEMA]).toMatchObject({
      type: 'object',
      required: ['type', 'title', 'status', 'detail'],
      properties: { type: { type: 'string', format: 'uri' }, status: { type: 'integer' } },
    });
    expect(document.components.schemas.ChargeView).toBeDefined();
  });

  it('finds routes wherever Swagger puts them: versions and class-level @Idempotent()', () => {
    expect(keyHeader(operation('/api/v2/charges/versioned'))).toBeDefined();
    expect(keyHeader(operation('/api/v1/orders'))).toBeDefined();
    expect(operation('/api/v1/orders').responses['422']).toBeDefined();
  });

  it('leaves routes without idempotency alone', () => {
    for (const op of [operation('/api/v1/charges/{id}', 'get'), operation('/api/v1/orders/quote')]) {
      expect(keyHeader(op)).toBeUndefined();
      expect(op['x-idempotency']).toBeUndefined();
      for (const status of ['409', '422', '503']) expect(op.responses[status]).toBeUndefined();
      for (const response of Object.values(op.responses) as any[]) expect(response.headers).toBeUndefined();
    }
  });

  it('changes nothing more when applied twice', () => {
    const once = structuredClone(document);
    expect(applyIdempotencyToOpenApi(document)).toEqual(once);
  });

  it("without applyIdempotencyToOpenApi, the module only marks the operation; the app's metadata is untouched", () => {
    const plain: any = generate(app);
    const op = plain.paths['/api/v1/charges'].post;
    expect(op['x-idempotency']).toEqual({
      header: 'Idempotency-Key',
      required: true,
      maxKeyLength: MAX_KEY_LENGTH,
      ttlMs: 86_400_000,
    });
    expect(op.responses).toEqual({ 201: { description: '' } });
    expect(keyHeader(op)).toBeUndefined();
    expect(plain.paths['/api/v1/charges/documented'].post.responses['409']).toEqual({ description: 'The app says 409 too' });
  });

  it('serves the document at /docs-json and Swagger UI at /docs', async () => {
    const json = await send(url, 'GET', '/docs-json');
    expect(json.status).toBe(200);
    expect(keyHeader(json.json().paths['/api/v1/charges'].post)).toMatchObject({ required: true });
    const ui = await send(url, 'GET', '/docs');
    expect(ui.status).toBe(200);
    expect(ui.text()).toContain('swagger-ui');
  });
});

describe('the documented key rule', () => {
  it('is the rule the server applies to a bare key: pattern and length accept exactly what the parser accepts', () => {
    const pattern = new RegExp(BARE_KEY_PATTERN);
    const key = fc.oneof(
      fc.string({ unit: fc.integer({ min: 0x00, max: 0x7f }).map((c) => String.fromCharCode(c)), maxLength: 80 }),
      fc.string({ unit: 'grapheme-ascii', minLength: 60, maxLength: 70 }),
      fc.string({ maxLength: 10 }),
    );
    fc.assert(
      fc.property(key, (value) => {
        const documented = value.length >= 1 && value.length <= MAX_KEY_LENGTH && pattern.test(value);
        // The quoted form is the other accepted spelling, described in words, not by the pattern.
        const parsed = parseIdempotencyKey([value], MAX_KEY_LENGTH);
        if (value.startsWith('"')) return !documented;
        return documented === parsed.ok;
      }),
      { numRuns: 2_000 },
    );
  });
});

describe.each(ADAPTERS)('the sample app over %s', (adapter) => {
  let app: INestApplication;
  let url: string;

  beforeAll(async () => {
    const schema = await freshSchema(`openapi_sample_${adapter}`);
    const config = loadConfig({ HTTP_ADAPTER: adapter, DATABASE_URL: databaseUrl() });
    app = await createSampleApp({ ...config, databaseUrl: databaseUrl(), databaseSchema: schema, logger: false });
    await app.listen(0, '127.0.0.1');
    url = (await app.getUrl()).replace('[::1]', '127.0.0.1');
  });
  afterAll(async () => {
    await app?.close();
  });

  it('serves Swagger UI at /docs and a document at /docs-json where POST /charges documents its key and answers', async () => {
    expect((await send(url, 'GET', '/docs')).status).toBe(200);
    const res = await send(url, 'GET', '/docs-json');
    expect(res.status).toBe(200);
    const charges = res.json().paths['/charges'];
    const header = charges.post.parameters.find((p: any) => p.in === 'header' && p.name === 'Idempotency-Key');
    expect(header).toMatchObject({ required: true, schema: { minLength: 1, maxLength: 255 } });
    expect(Object.keys(charges.post.responses).sort()).toEqual(['201', '400', '409', '422', '503']);
    expect(charges.get.parameters?.some((p: any) => p.name === 'Idempotency-Key')).toBeFalsy();
    // The operator board is not part of the API the document describes.
    expect(Object.keys(res.json().paths).filter((path) => path.startsWith('/board'))).toEqual([]);
  });
});

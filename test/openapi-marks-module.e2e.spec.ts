import { afterEach, describe, expect, it, jest } from '@jest/globals';
import { Controller, Logger, Module, Post, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { DocumentBuilder, SwaggerModule } from '@nestjs/swagger';
import { TypeOrmModule } from '@nestjs/typeorm';
import { Idempotent, IdempotencyModule } from '../src/index.js';
import { openApiMessages } from '../src/openapi/messages.js';
import { applyIdempotencyToOpenApi, IdempotencyOpenApiModule } from '../src/openapi/index.js';
import { createTables, dataSourceOptions, freshSchema } from './support/database.js';

// A file of its own: whether an app of this process ran the marks is module state, and
// here the first app must be one without IdempotencyOpenApiModule.

@Controller('charges')
class ChargesController {
  @Post()
  @Idempotent()
  create() {
    return { id: 'ch_1' };
  }
}

async function createApp(schema: string, withMarks: boolean): Promise<INestApplication> {
  @Module({
    imports: [
      TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }),
      IdempotencyModule.forRoot({ tenant: () => 'openapi', sweep: false }),
      ...(withMarks ? [IdempotencyOpenApiModule] : []),
    ],
    controllers: [ChargesController],
  })
  class MarksTestModule {}
  return NestFactory.create(MarksTestModule, { logger: false, abortOnError: false });
}

const generate = (app: INestApplication): any => SwaggerModule.createDocument(app, new DocumentBuilder().setTitle('t').build());

describe('IdempotencyOpenApiModule: the marks come from the OpenAPI subpath, not from IdempotencyModule', () => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  it('without it, nothing is marked, and applyIdempotencyToOpenApi warns with what to import', async () => {
    const schema = await freshSchema('openapi_marks_module_off');
    await createTables(schema);
    app = await createApp(schema, false);
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    try {
      const document = applyIdempotencyToOpenApi(generate(app));
      expect(document.paths['/charges'].post['x-idempotency']).toBeUndefined();
      expect(document.paths['/charges'].post.parameters ?? []).toEqual([]);
      expect(warn.mock.calls).toEqual([[openApiMessages.marksModuleMissing]]);
      expect(openApiMessages.marksModuleMissing).toContain(
        "imports: [IdempotencyOpenApiModule]` (from 'nest-idempotency-pg/openapi')",
      );
    } finally {
      warn.mockRestore();
    }
  });

  it('with it, the route is marked and documented, without a warning', async () => {
    const schema = await freshSchema('openapi_marks_module_on');
    await createTables(schema);
    app = await createApp(schema, true);
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    try {
      const operation = applyIdempotencyToOpenApi(generate(app)).paths['/charges'].post;
      expect(operation['x-idempotency']).toMatchObject({ header: 'Idempotency-Key', required: true });
      expect(operation.parameters).toEqual([expect.objectContaining({ in: 'header', name: 'Idempotency-Key', required: true })]);
      expect(warn).not.toHaveBeenCalled();
    } finally {
      warn.mockRestore();
    }
  });
});

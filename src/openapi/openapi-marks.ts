import { Logger, type Provider, type Type } from '@nestjs/common';
import { PATH_METADATA } from '@nestjs/common/constants.js';
import { DiscoveryService, MetadataScanner } from '@nestjs/core';
import { IdempotencyConfigurationError } from '../errors/configuration.error.js';
import { openApiMessages } from './messages.js';
import { IDEMPOTENCY_OPTIONS } from '../idempotency.constants.js';
import type { ResolvedIdempotencyOptions } from '../idempotency.options.js';
import { IdempotentRoutes } from '../http/route-settings.js';

/** The vendor extension on every idempotent operation: what `applyIdempotencyToOpenApi` documents it from. */
export const OPENAPI_EXTENSION = 'x-idempotency';

/** What an idempotent route tells its OpenAPI operation. */
export interface IdempotencyOperationMark {
  header: string;
  required: boolean;
  maxKeyLength: number;
  ttlMs: number;
}

const IDEMPOTENCY_OPENAPI_MARKS = Symbol('IDEMPOTENCY_OPENAPI_MARKS');

/** Whether an app of this process marked its routes: `applyIdempotencyToOpenApi` warns when none did. */
export const openApiMarking = { ran: false };

type Swagger = typeof import('@nestjs/swagger');
type Handler = (...args: unknown[]) => unknown;

/**
 * Marks every idempotent route for `@nestjs/swagger`, when it is installed,
 * with an `x-idempotency` extension holding the route's resolved settings.
 * Swagger then carries the mark into each operation it generates for the
 * route (whatever the global prefix, versioning, router module or operation
 * id factory), so `applyIdempotencyToOpenApi` finds the operations without
 * guessing their paths, and adds nothing else to the app's own metadata:
 * its declared and inferred responses stay as they are.
 *
 * A factory provider of `IdempotencyOpenApiModule`, so it runs while the app
 * is created: a document is usually generated between `NestFactory.create()`
 * and `listen()`, before any lifecycle hook.
 */
export const openApiMarksProvider: Provider = {
  provide: IDEMPOTENCY_OPENAPI_MARKS,
  useFactory: markIdempotentRoutes,
  inject: [IdempotentRoutes, DiscoveryService, MetadataScanner, IDEMPOTENCY_OPTIONS],
};

async function markIdempotentRoutes(
  routes: IdempotentRoutes,
  discovery: DiscoveryService,
  scanner: MetadataScanner,
  options: ResolvedIdempotencyOptions,
): Promise<number> {
  openApiMarking.ran = true;
  const swagger = await loadSwagger();
  if (!swagger) return 0;
  let marked = 0;
  for (const wrapper of discovery.getControllers()) {
    const controller = wrapper.metatype as Type | undefined;
    if (!controller?.prototype) continue;
    for (const name of scanner.getAllMethodNames(controller.prototype)) {
      const handler = (controller.prototype as Record<string, unknown>)[name];
      if (typeof handler !== 'function' || !Reflect.hasMetadata(PATH_METADATA, handler)) continue;
      let settings;
      try {
        settings = routes.get(controller, handler as Handler);
      } catch (error) {
        // A misconfigured route: IdempotentRoutes stops the app with every such route listed, at init.
        if (error instanceof IdempotencyConfigurationError) continue;
        throw error;
      }
      if (!settings) continue;
      const mark: IdempotencyOperationMark = {
        header: options.header,
        required: settings.options.required,
        maxKeyLength: options.maxKeyLength,
        ttlMs: settings.options.ttlMs,
      };
      // Swagger keeps operation metadata on the handler function, as its own decorators do.
      swagger.ApiExtension(OPENAPI_EXTENSION, mark)(controller.prototype, name, { value: handler });
      marked++;
    }
  }
  return marked;
}

/** `@nestjs/swagger` is an optional peer: an app without it gets no marks and no error. */
async function loadSwagger(): Promise<Swagger | undefined> {
  try {
    return await import('@nestjs/swagger');
  } catch (error) {
    const { code, message } = error as { code?: unknown; message?: unknown };
    const absent =
      (code === 'ERR_MODULE_NOT_FOUND' || code === 'MODULE_NOT_FOUND') &&
      typeof message === 'string' &&
      message.includes("'@nestjs/swagger'");
    if (!absent) {
      new Logger('IdempotencyOpenApiModule').warn(openApiMessages.swaggerUnloadable(String(message)));
    }
    return undefined;
  }
}

import { SetMetadata, UseInterceptors } from '@nestjs/common';
import { IDEMPOTENT_METADATA, SKIP_IDEMPOTENCY_METADATA } from './idempotency.constants.js';
import { IdempotencyInterceptor } from './transports/idempotency.interceptor.js';
import { isEntryPoint } from './http/resolve-route-settings.js';
import type { IdempotencyRouteOptions } from './idempotency.options.js';
import { markHandlerStart } from './transaction/mark-handler-start.js';

/** One interceptor for every kind of entry point: it hands messages and GraphQL mutations to theirs. */
const INTERCEPTORS = [IdempotencyInterceptor];

/**
 * Makes a route (or every route of a controller) idempotent. Options override
 * the module's for this route; method options win over class options.
 *
 * ```ts
 * @Post() @Idempotent({ ttl: '1h' })
 * create(@Body() dto: CreateCharge) { ... }
 * ```
 */
export function Idempotent(options: IdempotencyRouteOptions = {}): ClassDecorator & MethodDecorator {
  return ((target: object, propertyKey?: string | symbol, descriptor?: PropertyDescriptor) => {
    if (descriptor) {
      descriptor.value = markHandlerStart(descriptor.value as (...args: unknown[]) => unknown);
      SetMetadata(IDEMPOTENT_METADATA, options)(target, propertyKey!, descriptor);
      UseInterceptors(...INTERCEPTORS)(target, propertyKey!, descriptor);
      return descriptor;
    }
    const prototype = (target as { prototype: Record<string | symbol, unknown> }).prototype;
    for (const name of entryPointNames(prototype)) {
      const handler = prototype[name] as (...args: unknown[]) => unknown;
      Object.defineProperty(prototype, name, { value: markHandlerStart(handler), writable: true, configurable: true });
    }
    SetMetadata(IDEMPOTENT_METADATA, options)(target as never);
    UseInterceptors(...INTERCEPTORS)(target as never);
    return target;
  }) as ClassDecorator & MethodDecorator;
}

/**
 * Turns idempotency off for a route of an `@Idempotent()` controller, or back
 * on with `@SkipIdempotency(false)`.
 */
export function SkipIdempotency(skip = true): ClassDecorator & MethodDecorator {
  return SetMetadata(SKIP_IDEMPOTENCY_METADATA, skip);
}

/** The own and inherited methods of `prototype` that Nest calls as entry points (see `isEntryPoint`). */
function entryPointNames(prototype: object): Array<string | symbol> {
  const names = new Set<string | symbol>();
  for (let proto = prototype; proto && proto !== Object.prototype; proto = Object.getPrototypeOf(proto)) {
    for (const name of Reflect.ownKeys(proto)) {
      if (name !== 'constructor' && isEntryPoint(Object.getOwnPropertyDescriptor(proto, name)?.value)) names.add(name);
    }
  }
  return [...names];
}

import type { Type } from '@nestjs/common';
import {
  ENTRY_PROVIDER_WATERMARK,
  PATH_METADATA,
  RESPONSE_PASSTHROUGH_METADATA,
  ROUTE_ARGS_METADATA,
  SSE_METADATA,
} from '@nestjs/common/constants.js';
import { RouteParamtypes } from '@nestjs/common/enums/route-paramtypes.enum.js';
import type { DiscoveryService, MetadataScanner, Reflector } from '@nestjs/core';
import { IdempotencyConfigurationError } from '../errors/configuration.error.js';
import { messages } from '../errors/messages.js';
import { IDEMPOTENT_METADATA, SKIP_IDEMPOTENCY_METADATA } from '../idempotency.constants.js';
import type { IdempotencyRouteOptions, ResolvedIdempotencyOptions } from '../idempotency.options.js';
import { resolveRouteOptions } from '../resolve-options.js';
import type { RouteSettings } from './route-settings-type.js';

/*
 * A route's settings worked out from its metadata, and the start-up pass
 * that works them out for every route so a bad `@Idempotent({...})` stops
 * the app instead of failing its first request. Requests only look the
 * result up (`IdempotentRoutes.get`).
 */

type Handler = (...args: unknown[]) => unknown;

/**
 * Set by `@EventPattern`/`@MessagePattern` (@nestjs/microservices) and by
 * `@Mutation`/`@Query` (@nestjs/graphql) on their handlers; spelled out so
 * the core never loads those optional packages.
 */
const MESSAGE_PATTERN_METADATA = 'microservices:pattern';
const GRAPHQL_RESOLVER_METADATA = 'graphql:resolver_type';

/**
 * Whether `handler` is an entry point Nest calls: an HTTP route, a message
 * handler or a GraphQL resolver. The one definition for the start-up pass
 * here and for a class-level `@Idempotent()`, which marks the start of each
 * such handler: a handler one of them missed would have every failure taken
 * for a rejection before it ran.
 */
export function isEntryPoint(handler: unknown): handler is Handler {
  return (
    typeof handler === 'function' &&
    (Reflect.hasMetadata(PATH_METADATA, handler) ||
      Reflect.hasMetadata(MESSAGE_PATTERN_METADATA, handler) ||
      Reflect.hasMetadata(GRAPHQL_RESOLVER_METADATA, handler))
  );
}

/**
 * The start-up pass: `settingsOf` every entry point of the app's
 * controllers and resolvers, every route's problems reported at once.
 */
export function checkEveryRoute(
  discovery: DiscoveryService,
  scanner: MetadataScanner,
  settingsOf: (controller: Type, handler: Handler) => unknown,
): void {
  const problems: string[] = [];
  // Controllers hold HTTP routes and message handlers; GraphQL resolvers are providers marked as entry points.
  const resolvers = discovery.getProviders().filter((wrapper) => {
    const metatype = wrapper.metatype as Type | undefined | null;
    return !!metatype?.prototype && Reflect.getMetadata(ENTRY_PROVIDER_WATERMARK, metatype) === true;
  });
  for (const wrapper of [...discovery.getControllers(), ...resolvers]) {
    const controller = wrapper.metatype as Type | undefined;
    if (!controller?.prototype) continue;
    for (const name of scanner.getAllMethodNames(controller.prototype)) {
      const handler = (controller.prototype as Record<string, unknown>)[name];
      if (!isEntryPoint(handler)) continue;
      try {
        settingsOf(controller, handler);
      } catch (error) {
        if (!(error instanceof IdempotencyConfigurationError)) throw error;
        problems.push(error.message);
      }
    }
  }
  if (problems.length > 0) throw new IdempotencyConfigurationError(messages.config.routes(problems));
}

/** A route's settings from its metadata (method over class), or `null` when idempotency is off for it. */
export function resolveRouteSettings(
  reflector: Reflector,
  options: ResolvedIdempotencyOptions,
  controller: Type,
  handler: Handler,
): RouteSettings | null {
  const targets = [handler, controller];
  const skipped = reflector.getAllAndOverride<boolean | undefined>(SKIP_IDEMPOTENCY_METADATA, targets);
  const raw = reflector.getAllAndOverride<IdempotencyRouteOptions | undefined>(IDEMPOTENT_METADATA, targets);
  if (skipped || !raw) return null;
  const name = `${controller.name}.${handler.name}`;
  // Only HTTP routes can write the response themselves; other handlers' parameter types use other numbers.
  const unreplayable = Reflect.hasMetadata(PATH_METADATA, handler) ? unreplayableReason(controller, handler) : undefined;
  if (unreplayable) throw new IdempotencyConfigurationError(messages.config.unreplayableRoute(name, unreplayable));
  return { name, options: resolveRouteOptions(raw, options, `@Idempotent() on ${name}`) };
}

/** Why a route can never be replayed: it does not hand its response to Nest to send. */
function unreplayableReason(controller: Type, handler: Handler): string | undefined {
  if (Reflect.getMetadata(SSE_METADATA, handler)) return 'it is a server-sent events stream';
  // The same test Nest applies to decide that the handler sends the response itself.
  const args = (Reflect.getMetadata(ROUTE_ARGS_METADATA, controller, handler.name) ?? {}) as Record<string, unknown>;
  const writesItself = Object.keys(args).some((key) => {
    const type = Number(key.split(':')[0]);
    return type === RouteParamtypes.RESPONSE || type === RouteParamtypes.NEXT;
  });
  if (writesItself && !Reflect.getMetadata(RESPONSE_PASSTHROUGH_METADATA, controller, handler.name)) {
    return 'it writes the response itself through @Res() or @Next()';
  }
  return undefined;
}

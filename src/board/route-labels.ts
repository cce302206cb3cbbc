import { Injectable, RequestMethod, type OnModuleInit, type Type } from '@nestjs/common';
import { METHOD_METADATA, PATH_METADATA } from '@nestjs/common/constants.js';
import { DiscoveryService, MetadataScanner } from '@nestjs/core';

/**
 * Set by @nestjs/microservices (`@EventPattern`, `@MessagePattern`) and @nestjs/graphql
 * (`@Mutation`, `@Query`) on their handlers; spelled out so the board never loads those optional packages.
 */
const MESSAGE_PATTERN_METADATA = 'microservices:pattern';
const MESSAGE_HANDLER_TYPE_METADATA = 'microservices:handler_type';
const EVENT_HANDLER_TYPE = 2;
const GRAPHQL_RESOLVER_TYPE_METADATA = 'graphql:resolver_type';
const GRAPHQL_RESOLVER_NAME_METADATA = 'graphql:resolver_name';

/** The first of a path metadata's values, without its slashes at either end. */
function pathPart(metadata: unknown): string {
  const path = Array.isArray(metadata) ? metadata[0] : metadata;
  return typeof path === 'string' ? path.replace(/^\/+|\/+$/g, '') : '';
}

/** What a request, a message or a GraphQL operation names to reach `handler` of `controller`, if it is one. */
function labelOf(controller: Type, handler: unknown): string | undefined {
  if (typeof handler !== 'function') return undefined;
  if (Reflect.hasMetadata(PATH_METADATA, handler)) {
    const method = RequestMethod[Reflect.getMetadata(METHOD_METADATA, handler) as RequestMethod] ?? 'GET';
    const path = [pathPart(Reflect.getMetadata(PATH_METADATA, controller)), pathPart(Reflect.getMetadata(PATH_METADATA, handler))]
      .filter((part) => part !== '')
      .join('/');
    return `${method} /${path}`;
  }
  const patterns: unknown = Reflect.getMetadata(MESSAGE_PATTERN_METADATA, handler);
  if (patterns !== undefined) {
    const pattern = Array.isArray(patterns) ? patterns[0] : patterns;
    const kind = Reflect.getMetadata(MESSAGE_HANDLER_TYPE_METADATA, handler) === EVENT_HANDLER_TYPE ? 'event' : 'message';
    return `${kind} ${typeof pattern === 'string' ? pattern : JSON.stringify(pattern)}`;
  }
  const operation: unknown = Reflect.getMetadata(GRAPHQL_RESOLVER_TYPE_METADATA, handler);
  if (typeof operation === 'string') {
    const name: unknown = Reflect.getMetadata(GRAPHQL_RESOLVER_NAME_METADATA, handler);
    return `${operation.toLowerCase()} ${typeof name === 'string' ? name : handler.name}`;
  }
  return undefined;
}

/**
 * What each route of the app is called by those who call it (`POST /charges`,
 * `event refund.requested`, `mutation requestRefund`), found by its name in
 * the module's events (`ChargesController.create`): the board shows routes
 * that way, with the handler as a detail. Paths are as the controllers
 * declare them, without a global prefix or a RouterModule path.
 */
@Injectable()
export class BoardRouteLabels implements OnModuleInit {
  private readonly labels = new Map<string, string>();

  constructor(
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
  ) {}

  onModuleInit(): void {
    for (const wrapper of [...this.discovery.getControllers(), ...this.discovery.getProviders()]) {
      const type = wrapper.metatype as Type | undefined | null;
      if (typeof type !== 'function' || !type.prototype) continue;
      for (const name of this.scanner.getAllMethodNames(type.prototype)) {
        const label = labelOf(type, (type.prototype as Record<string, unknown>)[name]);
        const route = `${type.name}.${name}`;
        if (label !== undefined && !this.labels.has(route)) this.labels.set(route, label);
      }
    }
  }

  /** The label of the route the module's events name `route`; undefined for an `execute()` label or an unknown route. */
  of(route: string): string | undefined {
    return this.labels.get(route);
  }
}

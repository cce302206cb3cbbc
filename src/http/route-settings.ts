import { Inject, Injectable, type OnModuleInit, type Type } from '@nestjs/common';
import { DiscoveryService, MetadataScanner, Reflector } from '@nestjs/core';
import { IDEMPOTENCY_OPTIONS } from '../idempotency.constants.js';
import type { ResolvedIdempotencyOptions } from '../idempotency.options.js';
import { checkEveryRoute, resolveRouteSettings } from './resolve-route-settings.js';
import type { RouteSettings } from './route-settings-type.js';

type Handler = (...args: unknown[]) => unknown;

/**
 * The settings of every idempotent route, worked out at start-up so a bad `@Idempotent({...})` stops the app,
 * keyed by controller and handler: an inherited handler is a route per class.
 */
@Injectable()
export class IdempotentRoutes implements OnModuleInit {
  private readonly byClass = new WeakMap<Type, Map<Handler, RouteSettings | null>>();

  constructor(
    private readonly reflector: Reflector,
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
    @Inject(IDEMPOTENCY_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
  ) {}

  onModuleInit(): void {
    checkEveryRoute(this.discovery, this.scanner, (controller, handler) => this.get(controller, handler));
  }

  /** The route's settings, or `null` when idempotency is off for it. */
  get(controller: Type, handler: Handler): RouteSettings | null {
    let routes = this.byClass.get(controller);
    if (!routes) this.byClass.set(controller, (routes = new Map()));
    let settings = routes.get(handler);
    if (settings === undefined) {
      settings = resolveRouteSettings(this.reflector, this.options, controller, handler);
      routes.set(handler, settings);
    }
    return settings;
  }
}

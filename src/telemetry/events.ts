import { Injectable, Logger } from '@nestjs/common';
import type { IdempotencyEvent } from '../core/observer.js';

export type { IdempotencyEvent, IdempotencyOutcome } from '../core/observer.js';

export type IdempotencyEventListener = (event: IdempotencyEvent) => void;

/** A listener that is also told the tenant of an outcome; see `IdempotencyEvents.subscribeWithTenant`. */
export type TenantedEventListener = (event: IdempotencyEvent, tenant: string | undefined) => void;

/**
 * The typed event hook, with or without OpenTelemetry: `events.subscribe((e) => ...)`. Listeners run synchronously
 * where the event happens; one that throws is logged and never disturbs a request.
 */
@Injectable()
export class IdempotencyEvents {
  private readonly logger = new Logger('IdempotencyEvents');
  private readonly listeners = new Set<IdempotencyEventListener>();
  private readonly tenantedListeners = new Set<TenantedEventListener>();

  /** @returns a function that unsubscribes `listener` */
  subscribe(listener: IdempotencyEventListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /**
   * Like `subscribe`, and each outcome also comes with its tenant, for
   * per-tenant figures kept in the process (the operator board uses it).
   * Events themselves never carry a tenant, so that nothing exported from
   * them (metrics, logs) can; a listener here must keep it that way.
   * @returns a function that unsubscribes `listener`
   */
  subscribeWithTenant(listener: TenantedEventListener): () => void {
    this.tenantedListeners.add(listener);
    return () => this.tenantedListeners.delete(listener);
  }

  // Called for every request: no closure per listener, and nothing at all while nobody listens.
  emit(event: IdempotencyEvent, tenant?: string): void {
    for (const listener of this.listeners) {
      try {
        listener(event);
      } catch (error) {
        this.listenerThrew(event, error);
      }
    }
    for (const listener of this.tenantedListeners) {
      try {
        listener(event, tenant);
      } catch (error) {
        this.listenerThrew(event, error);
      }
    }
  }

  private listenerThrew(event: IdempotencyEvent, error: unknown): void {
    this.logger.warn(`An event listener threw on a ${event.type} event: ${error instanceof Error ? error.name : 'error'}`);
  }
}

import { Logger } from '@nestjs/common';
import type { IdempotencyEvent } from '../core/observer.js';

export type IdempotencyEventListener = (event: IdempotencyEvent) => void;

/** A listener that is also told the tenant of an outcome; see `IdempotencyEvents.subscribeWithTenant`. */
export type TenantedEventListener = (event: IdempotencyEvent, tenant: string | undefined) => void;

/** The listeners of `IdempotencyEvents` (events.ts), and how they subscribe. */
export abstract class EventListeners {
  private readonly logger = new Logger('IdempotencyEvents');
  protected readonly listeners = new Set<IdempotencyEventListener>();
  protected readonly tenantedListeners = new Set<TenantedEventListener>();

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

  protected listenerThrew(event: IdempotencyEvent, error: unknown): void {
    this.logger.warn(`An event listener threw on a ${event.type} event: ${error instanceof Error ? error.name : 'error'}`);
  }
}

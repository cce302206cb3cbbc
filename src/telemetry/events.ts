import { Injectable } from '@nestjs/common';
import type { IdempotencyEvent } from '../core/observer.js';
import { EventListeners } from './event-listeners.js';

export type { IdempotencyEvent, IdempotencyOutcome } from '../core/observer.js';
export type { IdempotencyEventListener, TenantedEventListener } from './event-listeners.js';

/**
 * The typed event hook, with or without OpenTelemetry: `events.subscribe((e) => ...)`. Listeners run synchronously
 * where the event happens; one that throws is logged and never disturbs a request.
 */
@Injectable()
export class IdempotencyEvents extends EventListeners {
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
}

import { Injectable, Logger } from '@nestjs/common';
import type { IdempotencyEvent } from '../core/observer.js';

export type { IdempotencyEvent, IdempotencyOutcome } from '../core/observer.js';

export type IdempotencyEventListener = (event: IdempotencyEvent) => void;

/**
 * The typed event hook, for apps that watch the module without
 * OpenTelemetry (or besides it): `events.subscribe((e) => ...)`. Listeners
 * run synchronously where the event happens; one that throws is logged and
 * never disturbs a request.
 */
@Injectable()
export class IdempotencyEvents {
  private readonly logger = new Logger('IdempotencyEvents');
  private readonly listeners = new Set<IdempotencyEventListener>();

  /** @returns a function that unsubscribes `listener` */
  subscribe(listener: IdempotencyEventListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  emit(event: IdempotencyEvent): void {
    for (const listener of this.listeners) {
      try {
        listener(event);
      } catch (error) {
        this.logger.warn(`An event listener threw on a ${event.type} event: ${error instanceof Error ? error.name : 'error'}`);
      }
    }
  }
}

import { Injectable, type OnModuleDestroy, type OnModuleInit } from '@nestjs/common';
import { IdempotencyEvents } from '../telemetry/events.js';
import { OutcomeHistory } from './outcome-history.js';

/** The last hour of this process's outcome events per tenant, fed by the module's own event hook. */
@Injectable()
export class BoardOutcomes implements OnModuleInit, OnModuleDestroy {
  readonly history = new OutcomeHistory();
  private unsubscribe?: () => void;

  constructor(private readonly events: IdempotencyEvents) {}

  onModuleInit(): void {
    this.unsubscribe = this.events.subscribeWithTenant((event, tenant) => this.history.record(event, tenant));
  }

  onModuleDestroy(): void {
    this.unsubscribe?.();
  }
}

import { HttpException, HttpStatus, Injectable } from '@nestjs/common';
import { setTimeout as sleep } from 'node:timers/promises';
import type { SimulateDto } from './create-charge.dto.js';

/**
 * A definite business outcome: the idempotency module stores and replays it
 * (its `onHttpException: 'store'` default) and rolls the charge row back.
 */
export class CardDeclinedException extends HttpException {
  constructor() {
    super(
      {
        type: 'https://example.com/problems/card-declined',
        title: 'Card declined',
        status: HttpStatus.PAYMENT_REQUIRED,
        detail: 'The card issuer declined the charge (simulated).',
      },
      HttpStatus.PAYMENT_REQUIRED,
    );
  }
}

/** Stands in for a slow, fallible payment provider; `simulate` in the request body drives it. */
@Injectable()
export class SimulatedCardProcessor {
  async capture(simulate: SimulateDto | null | undefined): Promise<void> {
    if (simulate?.delayMs) await sleep(simulate.delayMs);
    if (simulate?.outcome === 'decline') throw new CardDeclinedException();
    // An unknown outcome (a timeout, a crash): the module keeps the key in flight until its lease ends.
    if (simulate?.outcome === 'error') throw new Error('Simulated card processor failure');
  }
}

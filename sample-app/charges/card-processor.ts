import { HttpException, HttpStatus, Injectable, ServiceUnavailableException } from '@nestjs/common';
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

/**
 * The error Node gives when a payment provider's connection drops mid-request
 * (what `fetch` reports as the `cause` of its "fetch failed"). Whether the
 * provider charged is unknown, so it is an error like any other: a 500, the
 * key kept until its lease ends. Nothing here concerns the idempotency store.
 */
export function connectionResetByProvider(): NodeJS.ErrnoException {
  return Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET', errno: -104, syscall: 'read' });
}

/** Stands in for a slow, fallible payment provider; `simulate` in the request body drives it. */
@Injectable()
export class SimulatedCardProcessor {
  async capture(simulate: SimulateDto | null | undefined): Promise<void> {
    if (simulate?.delayMs) await sleep(simulate.delayMs);
    switch (simulate?.outcome) {
      case 'decline':
        throw new CardDeclinedException();
      // An unknown outcome (a timeout, a crash): the module keeps the key in flight until its lease ends.
      case 'error':
        throw new Error('Simulated card processor failure');
      case 'network':
        throw connectionResetByProvider();
      // The processor said it is down: a 503 of the handler's own, kept in flight like an error, not stored.
      case 'unavailable':
        throw new ServiceUnavailableException('The card processor is unavailable (simulated).');
    }
  }
}

import type { CallHandler, ExecutionContext } from '@nestjs/common';
import type { Subscriber } from 'rxjs';
import type { FailureReading } from '../core/outcomes.js';
import type { ClaimInfo, EngineOutcome } from '../core/work.js';
import type { RouteSettings } from '../http/route-settings-type.js';
import type { IdempotencyRuntime } from './run-idempotent.js';
import type { Done, Transport } from './transport.js';

/** What the GraphQL and message transports are built from: see `Transport` for what they supply. */
export abstract class NestTransport<R = unknown> implements Transport<R> {
  constructor(
    protected readonly runtime: IdempotencyRuntime,
    protected readonly route: RouteSettings,
    protected readonly context: ExecutionContext,
    protected readonly next: CallHandler,
    protected readonly subscriber: Subscriber<unknown>,
  ) {}

  abstract readKey(): string | undefined;
  abstract fingerprint(): string;
  abstract invoke(claim: ClaimInfo): Promise<Done<R>>;
  abstract readFailure(error: unknown): FailureReading | Promise<FailureReading>;
  abstract runWithoutKey(): void;
  abstract answer(outcome: EngineOutcome<R>): void | Promise<void>;
  abstract fail(error: unknown, key: string): void | Promise<void>;
}

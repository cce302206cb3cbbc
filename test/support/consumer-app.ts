import { Controller, Injectable, Module, type INestMicroservice, type LoggerService } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Ctx, EventPattern, MessagePattern, Payload, RpcException, Transport, type CustomStrategy } from '@nestjs/microservices';
import { TypeOrmModule } from '@nestjs/typeorm';
import type { EntityManager } from 'typeorm';
import {
  IdempotencyModule,
  Idempotent,
  Phased,
  TransactionHost,
  type IdempotencyModuleOptions,
  type Phases,
} from '../../src/index.js';
import { EffectLedger } from '../../src/ledger/index.js';
import { dataSourceOptions } from './database.js';
import { sleep } from './http.js';

/** A message of the tests: what to record, and how the handler should behave. */
export interface TestMessage {
  label: string;
  tenant?: string;
  /** Handler waits this long after its insert (a slow downstream call). */
  delayMs?: number;
  /** The first `failTimes` invocations for this label throw after their insert. */
  failTimes?: number;
  /** Every invocation throws an RpcException (a definite refusal, stored and replayed). */
  refuse?: boolean;
  /** Recorded in the effect ledger under this business key, the effect skipped when already recorded. */
  ledgerKey?: string;
  refundId?: string;
  idempotencyKey?: string;
}

/** What the handlers did, seen from inside the process. */
export class ConsumerProbe {
  readonly invocations = new Map<string, number>();
  count(label: string): number {
    return this.invocations.get(label) ?? 0;
  }
  record(label: string): number {
    const n = this.count(label) + 1;
    this.invocations.set(label, n);
    return n;
  }
}

@Injectable()
class Effects {
  constructor(
    private readonly tx: TransactionHost,
    private readonly ledger: EffectLedger,
  ) {}

  /** One effect row through the message's transaction; with a ledger key, only the first time that key is seen, ever. */
  async record(message: TestMessage): Promise<{ recorded: boolean }> {
    if (message.ledgerKey && !(await this.ledger.once(message.ledgerKey, { scope: 'refunds' }))) return { recorded: false };
    await this.tx.manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', [
      message.tenant ?? 'tenant-a',
      message.label,
    ]);
    return { recorded: true };
  }
}

function consumerController(probe: ConsumerProbe) {
  @Controller()
  class RefundsConsumer {
    constructor(private readonly effects: Effects) {}

    @EventPattern('refund.requested')
    @Idempotent({ lease: 1_500, maxDeliveries: 3 })
    async requested(@Payload() message: TestMessage) {
      const n = probe.record(message.label);
      const result = await this.effects.record(message);
      if (message.delayMs) await sleep(message.delayMs);
      if (message.refuse) throw new RpcException({ status: 'error', code: 'refund_refused', label: message.label });
      if (n <= (message.failTimes ?? 0)) throw new Error(`downstream failure ${n}`);
      return result;
    }

    @MessagePattern('refund.quote')
    @Idempotent({ lease: 1_500 })
    async quote(@Payload() message: TestMessage) {
      const n = probe.record(message.label);
      await this.effects.record(message);
      if (message.delayMs) await sleep(message.delayMs);
      if (message.refuse) throw new RpcException({ status: 'error', code: 'quote_refused' });
      return { label: message.label, invocation: n, quotedAt: new Date(Date.UTC(2026, 0, 1)) };
    }

    @EventPattern('refund.keyed')
    @Idempotent({ key: 'refundId' })
    async keyed(@Payload() message: TestMessage, @Ctx() _context: unknown) {
      probe.record(message.label);
      return this.effects.record(message);
    }

    @EventPattern('refund.phased')
    @Idempotent({ phases: true, lease: 1_000 })
    // Nest 12 types an event handler's arguments after the payload as unknown.
    async phased(@Payload() message: TestMessage, @Phased() injected: unknown) {
      const phases = injected as Phases<EntityManager>;
      await phases.run('record', async (tx) => {
        probe.record(`${message.label}:record`);
        await tx.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['tenant-a', message.label]);
      });
      if (probe.record(`${message.label}:between`) <= (message.failTimes ?? 0)) throw new Error('crash between phases');
      await phases.run('confirm', async () => probe.record(`${message.label}:confirm`));
      return { resumed: phases.resumed };
    }

    @EventPattern('refund.optional')
    @Idempotent({ required: false })
    async optional(@Payload() message: TestMessage) {
      probe.record(message.label);
      return this.effects.record(message);
    }
  }
  return RefundsConsumer;
}

export interface ConsumerApp {
  app: INestMicroservice;
  probe: ConsumerProbe;
  /** What the app logged (log, warn, error), each line with its context: `[Idempotency] …`. */
  logs: string[];
  close(): Promise<void>;
}

/** Keeps the app's log lines for assertions; also prints them with TEST_CONSUMER_LOGS set. */
class CapturedLogs implements LoggerService {
  readonly lines: string[] = [];
  private keep(level: string, message: unknown, context: unknown): void {
    const line = `${level} [${String(context ?? '')}] ${String(message)}`;
    this.lines.push(line);
    if (process.env.TEST_CONSUMER_LOGS) console.log(line);
  }
  log(message: unknown, context?: unknown) {
    this.keep('log', message, context);
  }
  warn(message: unknown, context?: unknown) {
    this.keep('warn', message, context);
  }
  error(message: unknown, _stack?: unknown, context?: unknown) {
    this.keep('error', message, context);
  }
  debug() {}
  verbose() {}
}

/**
 * A Nest microservice consuming `transport` with the module: the tenant comes
 * from the message (`tenant`, default tenant-a), effects go to the schema's
 * `effects` table through the message's transaction.
 */
export async function startConsumer(
  schema: string,
  transport:
    { rmq: Record<string, unknown> } | { tcp: { host: string; port: number } } | { strategy: CustomStrategy['strategy'] },
  options: Partial<IdempotencyModuleOptions> = {},
): Promise<ConsumerApp> {
  const probe = new ConsumerProbe();
  const logs = new CapturedLogs();
  @Module({
    imports: [
      TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }),
      IdempotencyModule.forRoot({
        tenant: (ctx) => (ctx.getType() === 'rpc' ? (ctx.switchToRpc().getData<TestMessage>().tenant ?? 'tenant-a') : undefined),
        sweep: false,
        ledger: {},
        ...options,
      }),
    ],
    controllers: [consumerController(probe)],
    providers: [Effects],
  })
  class ConsumerModule {}

  const app = await NestFactory.createMicroservice(ConsumerModule, {
    ...('rmq' in transport
      ? { transport: Transport.RMQ, options: transport.rmq }
      : 'tcp' in transport
        ? { transport: Transport.TCP, options: transport.tcp }
        : { strategy: transport.strategy }),
    logger: logs,
  } as never);
  await app.listen();
  return { app, probe, logs: logs.lines, close: () => app.close() };
}

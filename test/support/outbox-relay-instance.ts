/**
 * An outbox relay in an OS process of its own, for tests that kill it
 * mid-delivery (started through run-typescript.mjs; env DATABASE_URL and
 * OUTBOX_SCHEMA, OUTBOX_MAX_ATTEMPTS). Over stdin/stdout:
 * - prints `ready` once the app has started;
 * - `round` runs one relay round, printing `delivering <id> <attempt>` when
 *   the handler of topic `email` starts (it never settles: a send that hangs
 *   until the process is killed) and `report <JSON>` when the round ends;
 * - the app's log lines are printed as `log <level> <message>`.
 */
import { Module, type LoggerService } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ScheduleModule } from '@nestjs/schedule';
import { TypeOrmModule } from '@nestjs/typeorm';
import { createInterface } from 'node:readline';
import { IdempotencyModule } from '../../src/index.js';
import { OutboxRelay } from '../../src/outbox/index.js';

const schema = process.env.OUTBOX_SCHEMA!;

const print = (line: string) => process.stdout.write(`${line.replace(/\n/g, ' ')}\n`);

class LineLogger implements LoggerService {
  log(message: unknown) {
    print(`log log ${String(message)}`);
  }
  warn(message: unknown) {
    print(`log warn ${String(message)}`);
  }
  error(message: unknown) {
    print(`log error ${String(message)}`);
  }
}

@Module({
  imports: [
    ScheduleModule.forRoot(),
    TypeOrmModule.forRoot({
      type: 'postgres',
      url: process.env.DATABASE_URL,
      schema,
      extra: { options: `-c search_path=${schema}`, max: 4 },
      retryAttempts: 0,
    }),
    IdempotencyModule.forRoot({
      tenant: () => 't',
      sweep: false,
      outbox: {
        relay: {
          // Rounds are run over stdin; the schedule never ticks.
          interval: '1h',
          maxAttempts: Number(process.env.OUTBOX_MAX_ATTEMPTS ?? 3),
          // Long enough that the relay never gives up on a delivery itself: only the kill ends it.
          lockTimeout: '10min',
          deliveryTimeout: '5min',
        },
      },
    }),
  ],
})
class RelayInstanceModule {}

async function main(): Promise<void> {
  const app = await NestFactory.createApplicationContext(RelayInstanceModule, { logger: new LineLogger() });
  const relay = app.get(OutboxRelay);
  relay.handle('email', (message) => {
    print(`delivering ${message.id} ${message.attempt}`);
    return new Promise<void>(() => undefined);
  });
  print('ready');
  for await (const line of createInterface({ input: process.stdin })) {
    if (line !== 'round') throw new Error(`expected "round", got ${line}`);
    print(`report ${JSON.stringify(await relay.relayOnce())}`);
  }
  await app.close();
}

void main();

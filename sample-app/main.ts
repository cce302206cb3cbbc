import 'reflect-metadata';
import type { INestApplication } from '@nestjs/common';
import { Logger } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { boardBannerLine, demoKeyOf } from './banner.js';
import { loadConfig, type SampleConfig } from './config.js';
import { createSampleApp } from './create-app.js';
import type { EmbeddedDatabase } from './embedded-postgres.js';

const logger = new Logger('SampleApp');
const REPEATED_SIGNAL_WINDOW_MS = 1_000;

async function main(): Promise<void> {
  const config = loadConfig();
  let embedded: EmbeddedDatabase | undefined;
  let databaseUrl = config.databaseUrl;
  if (!databaseUrl) {
    embedded = await startEmbeddedDatabase();
    databaseUrl = embedded.url;
  }

  let app: INestApplication;
  try {
    app = await createSampleApp({ ...config, databaseUrl });
    await app.listen(config.port);
  } catch (error) {
    await embedded?.stop();
    throw error;
  }
  stopGracefullyOnSignals(app, embedded, config);

  const port = new URL(await app.getUrl()).port;
  logger.log(`Database: ${maskPassword(databaseUrl)}${embedded ? ' (embedded, data in .pgdata/sample)' : ''}`);
  logger.log(`OpenAPI: Swagger UI at http://localhost:${port}/docs, the document at http://localhost:${port}/docs-json`);
  logger.log(boardBannerLine(port, config));
  logger.log(`GraphQL: POST http://localhost:${port}/graphql (mutation requestRefund, with an Idempotency-Key header)`);
  if (config.rabbitmqUrl) {
    logger.log(
      `Consuming refund requests from RabbitMQ ${maskPassword(config.rabbitmqUrl)}, queue ${config.refundQueue} ` +
        `(dead letters in ${config.refundQueue}.dead)`,
    );
  }
  if (config.natsUrl) {
    // NATS_URL may be host:port, which is no URL: only a password after `//user:` is masked.
    const server = config.natsUrl.replace(/(\/\/[^:@/]*:)[^@/]*@/, '$1***@');
    logger.log(
      `Consuming refund requests from NATS JetStream ${server}, stream ${config.refundStream}, subject ` +
        `${config.refundSubject} (dead letters in ${config.refundStream}_DEAD)`,
    );
  }
  if (!config.rabbitmqUrl && !config.natsUrl) {
    logger.log('Neither RABBITMQ_URL nor NATS_URL is set: refund requests come through GraphQL only.');
  }
  logger.log(`Payments API on http://localhost:${port} (${config.httpAdapter}). Try:\n\n${curlExample(port, config)}\n`);
}

/**
 * Starts the embedded server with its data under `<repo>/.pgdata/sample`,
 * kept between runs.
 */
async function startEmbeddedDatabase(): Promise<EmbeddedDatabase> {
  // On import, embedded-postgres hooks SIGINT, SIGTERM and beforeExit to stop
  // the server and call process.exit(): that would cut off in-flight requests
  // and override the exit code. The app stops the server itself once they are
  // done, so those hooks are removed; its `exit` hook stays, to stop the
  // server if the process dies some other way.
  const hooked = ['SIGINT', 'SIGTERM', 'beforeExit'];
  const events: NodeJS.EventEmitter = process;
  const before = new Map(hooked.map((event) => [event, new Set(events.listeners(event))]));
  const { startEmbeddedPostgres } = await import('./embedded-postgres.js');
  for (const event of hooked) {
    for (const listener of events.listeners(event)) {
      if (!before.get(event)!.has(listener)) events.removeListener(event, listener as (...args: unknown[]) => void);
    }
  }
  const dataDir = join(repositoryRoot(), '.pgdata', 'sample');
  logger.log(`DATABASE_URL is not set: starting an embedded PostgreSQL server (data in ${dataDir}).`);
  return startEmbeddedPostgres({ dataDir, database: 'sample', persistent: true, log: (line) => logger.warn(line.trim()) });
}

/**
 * On SIGTERM/SIGINT: stop accepting connections, let in-flight requests
 * finish (up to `shutdownTimeoutMs`), close the app (its shutdown hooks close
 * the connection pool), then stop the embedded server. A second signal (a
 * second apart from the first), or the timeout, exits at once with status 1.
 *
 * With the embedded server, Ctrl-C in a terminal reaches the server too (same
 * process group) and it shuts down at once, so requests in flight then fail;
 * `kill -TERM <pid>` of the Node process drains them.
 */
function stopGracefullyOnSignals(app: INestApplication, embedded: EmbeddedDatabase | undefined, config: SampleConfig): void {
  let stoppingSince: number | undefined;
  const stopDatabase = async () => {
    if (!embedded) return;
    await embedded.stop();
    logger.log('Embedded PostgreSQL stopped.');
  };
  const forceExit = (reason: string) => {
    logger.error(`${reason}: exiting without waiting for in-flight requests.`);
    const giveUp = delay(3_000, undefined, { ref: false });
    void Promise.race([stopDatabase(), giveUp])
      .catch(() => undefined)
      .finally(() => process.exit(1));
  };
  const stop = async (signal: NodeJS.Signals) => {
    if (stoppingSince !== undefined) {
      // Under `npm run`, one Ctrl-C arrives twice (from the terminal and forwarded by npm): only a later one forces.
      if (Date.now() - stoppingSince > REPEATED_SIGNAL_WINDOW_MS) forceExit(`${signal} received again`);
      return;
    }
    stoppingSince = Date.now();
    logger.log(`${signal} received: finishing in-flight requests (up to ${config.shutdownTimeoutMs} ms).`);
    const timer = setTimeout(() => forceExit('Shutdown timeout'), config.shutdownTimeoutMs);
    try {
      // Stops listening, waits for open requests, then runs the shutdown hooks (sweeper, DataSource pool).
      await app.close();
      await stopDatabase();
      logger.log('Stopped.');
    } catch (error) {
      logger.error(`Shutdown failed: ${error instanceof Error ? error.stack : String(error)}`);
      process.exitCode = 1;
      await stopDatabase().catch(() => undefined);
    } finally {
      clearTimeout(timer);
    }
    // Explicit, because embedded-postgres's remaining `exit` hook fails when the process ends on its own.
    process.exit();
  };
  for (const signal of ['SIGTERM', 'SIGINT'] as const) process.on(signal, (received: NodeJS.Signals) => void stop(received));
}

function repositoryRoot(): string {
  // Compiled to dist-sample/sample-app/main.js, or run from sample-app/main.ts: walk up to package.json.
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json'))) {
    const parent = dirname(dir);
    if (parent === dir) return process.cwd();
    dir = parent;
  }
  return dir;
}

export function maskPassword(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.password) parsed.password = '***';
    return parsed.toString();
  } catch {
    return '(DATABASE_URL is not a URL)';
  }
}

/** Pasted twice, it shows a replay: the key is fresh per start, not per paste. */
function curlExample(port: string, config: SampleConfig): string {
  // Print the key only when it is a demo key; never echo a configured secret into logs.
  const demoKey = demoKeyOf(config);
  return [
    `curl -i http://localhost:${port}/charges \\`,
    `  -H 'Authorization: Bearer ${demoKey ?? '<your API key>'}' \\`,
    `  -H 'Idempotency-Key: ${randomUUID()}' \\`,
    `  -H 'Content-Type: application/json' \\`,
    `  -d '{"amount":2500,"currency":"usd","customer":"cus_123","description":"Coffee beans"}'`,
  ].join('\n');
}

main().catch((error: unknown) => {
  logger.error(error instanceof Error ? (error.stack ?? error.message) : String(error));
  process.exit(1);
});

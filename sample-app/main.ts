import 'reflect-metadata';
import type { INestApplication } from '@nestjs/common';
import { Logger } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { DEFAULT_API_KEYS, loadConfig, parseApiKeys, type SampleConfig } from './config.js';
import { createSampleApp } from './create-app.js';
import type { EmbeddedDatabase } from './embedded-postgres.js';

const logger = new Logger('SampleApp');
const SHUTDOWN_SIGNALS = ['SIGTERM', 'SIGINT'] as const;

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
  logger.log(`Payments API on http://localhost:${port} (${config.httpAdapter}). Try:\n\n${curlExample(port, config)}\n`);
}

/**
 * Starts the embedded server with its data under `<repo>/.pgdata/sample`,
 * kept between runs.
 */
async function startEmbeddedDatabase(): Promise<EmbeddedDatabase> {
  // embedded-postgres registers SIGINT/SIGTERM handlers on import that stop
  // the server and exit at once, which would cut off in-flight requests. The
  // app stops it itself once they are done, so those two handlers are removed.
  const before = new Map(SHUTDOWN_SIGNALS.map((signal) => [signal, new Set(process.listeners(signal))]));
  const { startEmbeddedPostgres } = await import('./embedded-postgres.js');
  for (const signal of SHUTDOWN_SIGNALS) {
    for (const listener of process.listeners(signal)) {
      if (!before.get(signal)!.has(listener)) process.removeListener(signal, listener);
    }
  }
  const dataDir = join(repositoryRoot(), '.pgdata', 'sample');
  logger.log(`DATABASE_URL is not set: starting an embedded PostgreSQL server (data in ${dataDir}).`);
  return startEmbeddedPostgres({ dataDir, database: 'sample', persistent: true, log: (line) => logger.warn(line.trim()) });
}

/**
 * On SIGTERM/SIGINT: stop accepting connections, let in-flight requests
 * finish (up to `shutdownTimeoutMs`), close the app (its shutdown hooks close
 * the connection pool), then stop the embedded server. A second signal, or
 * the timeout, exits at once with status 1.
 */
function stopGracefullyOnSignals(app: INestApplication, embedded: EmbeddedDatabase | undefined, config: SampleConfig): void {
  let stopping = false;
  const forceExit = async (reason: string) => {
    logger.error(`${reason}: exiting without waiting for in-flight requests.`);
    await embedded?.stop().catch(() => undefined);
    process.exit(1);
  };
  const stop = async (signal: NodeJS.Signals) => {
    if (stopping) return void forceExit(`${signal} received again`);
    stopping = true;
    logger.log(`${signal} received: finishing in-flight requests (up to ${config.shutdownTimeoutMs} ms).`);
    const timer = setTimeout(() => void forceExit('Shutdown timeout'), config.shutdownTimeoutMs);
    try {
      // Closes the HTTP server (waits for open requests), then runs shutdown hooks: sweeper, DataSource.
      await app.close();
      if (embedded) {
        await embedded.stop();
        logger.log('Embedded PostgreSQL stopped.');
      }
      logger.log('Stopped.');
    } catch (error) {
      logger.error(`Shutdown failed: ${error instanceof Error ? error.stack : String(error)}`);
      process.exitCode = 1;
      await embedded?.stop().catch(() => undefined);
    } finally {
      clearTimeout(timer);
    }
    // Nothing is left on the event loop, so the process now exits on its own.
  };
  for (const signal of SHUTDOWN_SIGNALS) process.on(signal, (received: NodeJS.Signals) => void stop(received));
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
  const [demoKey] = [...parseApiKeys(DEFAULT_API_KEYS).keys()].filter((key) => config.apiKeys.has(key));
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

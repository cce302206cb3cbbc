import { describe, expect, it } from '@jest/globals';
import { DataSource, type Logger as TypeOrmLogger } from 'typeorm';
import { REDACTED, redactQueryError } from './redacted-query-error.js';
import { installRedactingLogger, redactingLogger } from './redacting-logger.js';
import { sqlMarker } from './sql-marker.js';

class RecordingLogger implements TypeOrmLogger {
  calls: unknown[][] = [];
  logQuery(...args: unknown[]) {
    this.calls.push(['query', ...args.slice(0, 2)]);
  }
  logQueryError(...args: unknown[]) {
    this.calls.push(['error', ...args.slice(0, 3)]);
  }
  logQuerySlow(...args: unknown[]) {
    this.calls.push(['slow', ...args.slice(0, 3)]);
  }
  logSchemaBuild() {}
  logMigration() {}
  log() {}
}

const moduleSql = `${sqlMarker('claim')}\n SELECT $1`;

describe('redacting logger', () => {
  it("redacts the module's parameters and leaves the application's queries alone", () => {
    const inner = new RecordingLogger();
    const logger = redactingLogger(inner);
    logger.logQuery(moduleSql, ['secret-key']);
    logger.logQuerySlow(900, moduleSql, ['secret-key']);
    logger.logQuery('SELECT $1', ['app-value']);
    expect(inner.calls).toEqual([
      ['query', moduleSql, [REDACTED]],
      ['slow', 900, moduleSql, [REDACTED]],
      ['query', 'SELECT $1', ['app-value']],
    ]);
  });

  it('wraps once, and again when the data source gets a new logger', () => {
    const dataSource = new DataSource({ type: 'postgres', logger: new RecordingLogger() });
    installRedactingLogger(dataSource);
    const wrapped = dataSource.logger;
    installRedactingLogger(dataSource);
    expect(dataSource.logger).toBe(wrapped);
    expect(redactingLogger(wrapped)).toBe(wrapped);
    const next = new RecordingLogger();
    dataSource.setOptions({ logger: next });
    dataSource.logger.logQuery(moduleSql, ['secret-key']);
    expect(next.calls).toEqual([['query', moduleSql, [REDACTED]]]);
  });

  it('strips parameters and value-bearing fields from an error and its driver error, keeping code and SQL', () => {
    const driverError = Object.assign(new Error('duplicate key value violates unique constraint "k" for secret-key'), {
      code: '23505',
      detail: 'Key (key)=(secret-key) already exists.',
    });
    const error = Object.assign(new Error(driverError.message), {
      query: moduleSql,
      parameters: ['tenant', 'secret-key'],
      code: '23505',
      detail: driverError.detail,
      driverError,
    });
    redactQueryError(error, ['tenant', 'secret-key']);
    expect(error).toMatchObject({ query: moduleSql, parameters: [REDACTED, REDACTED], code: '23505', detail: REDACTED });
    expect(driverError.detail).toBe(REDACTED);
    expect(`${error.message} ${error.stack} ${driverError.message}`).not.toContain('secret-key');
  });

  it("leaves a connection error's message alone, so unavailability is still recognised", () => {
    const error = Object.assign(new Error('Connection terminated unexpectedly'), { code: 'ECONNRESET' });
    redactQueryError(error, ['Connection terminated']);
    expect(error.message).toBe('Connection terminated unexpectedly');
  });
});

import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { LoggerService } from '@nestjs/common';
import { inspect } from 'node:util';
import type pg from 'pg';
import type { Logger as TypeOrmLogger } from 'typeorm';
import { createTables, freshSchema, sqlClient } from './support/database.js';
import { post } from './support/http.js';
import { ADAPTERS, startTestApp, type TestApp } from './support/test-app.js';

/**
 * Renders logged values the way a thorough log sink would: every nested
 * property, errors with their stack and cause, and Buffers also as text,
 * so a key or a body hidden anywhere in an argument is found.
 */
function render(values: unknown[]): string {
  const parts = [
    inspect(values, { depth: Infinity, maxArrayLength: Infinity, maxStringLength: Infinity, breakLength: Infinity }),
  ];
  const seen = new Set<unknown>();
  const walk = (value: unknown) => {
    if (!value || typeof value !== 'object' || seen.has(value)) return;
    seen.add(value);
    if (Buffer.isBuffer(value)) {
      parts.push(value.toString('utf8'));
      return;
    }
    for (const name of Object.getOwnPropertyNames(value)) walk((value as Record<string, unknown>)[name]);
  };
  values.forEach(walk);
  return parts.join('\n');
}

/** Everything TypeORM logs (with `logging: 'all'`). */
class CapturingTypeOrmLogger implements TypeOrmLogger {
  readonly lines: string[] = [];
  private capture(kind: string, ...args: unknown[]) {
    this.lines.push(`${kind} ${render(args)}`);
  }
  logQuery(...args: unknown[]) {
    this.capture('query', ...args.slice(0, 2));
  }
  logQueryError(...args: unknown[]) {
    this.capture('query-error', ...args.slice(0, 3));
  }
  logQuerySlow(...args: unknown[]) {
    this.capture('query-slow', ...args.slice(0, 3));
  }
  logSchemaBuild(message: string) {
    this.capture('schema', message);
  }
  logMigration(message: string) {
    this.capture('migration', message);
  }
  log(level: string, message: unknown) {
    this.capture(level, message);
  }
}

/** Everything Nest logs, including the exceptions its exception filter reports. */
class CapturingNestLogger implements LoggerService {
  readonly lines: string[] = [];
  log(...args: unknown[]) {
    this.lines.push(`log ${render(args)}`);
  }
  error(...args: unknown[]) {
    this.lines.push(`error ${render(args)}`);
  }
  warn(...args: unknown[]) {
    this.lines.push(`warn ${render(args)}`);
  }
  debug(...args: unknown[]) {
    this.lines.push(`debug ${render(args)}`);
  }
  verbose(...args: unknown[]) {
    this.lines.push(`verbose ${render(args)}`);
  }
  fatal(...args: unknown[]) {
    this.lines.push(`fatal ${render(args)}`);
  }
}

describe.each(ADAPTERS)('logs carry no key and no body over %s', (adapter) => {
  describe.each([false, true])('preparedStatements: %s', (preparedStatements) => {
    const typeorm = new CapturingTypeOrmLogger();
    const nest = new CapturingNestLogger();
    let api: TestApp;
    let db: pg.Client;
    let n = 0;
    // Distinctive strings that no log line could contain by chance.
    const fresh = () => `${adapter}-${preparedStatements ? 'ps' : 'plain'}-${Date.now()}-${++n}`;

    beforeAll(async () => {
      const schema = await freshSchema(`redaction_${adapter}_${preparedStatements}`);
      await createTables(schema);
      api = await startTestApp(adapter, schema, { preparedStatements }, { logger: typeorm, logging: 'all', nestLogger: nest });
      db = await sqlClient(schema);
    });
    afterAll(async () => {
      await api?.close();
      await db?.end();
    });

    /** Sends one request whose key and body marker must never be logged, and returns them with the logs it caused. */
    async function request(key: string, tenant = 'tenant-a') {
      const secret = `body-marker-${key}`;
      const from = { typeorm: typeorm.lines.length, nest: nest.lines.length };
      const label = `label-${key}`;
      const res = await post(api.url, '/items', { label, secret }, `key-${key}`, tenant);
      return {
        res,
        key: `key-${key}`,
        secret,
        label,
        typeormLogs: () => typeorm.lines.slice(from.typeorm).join('\n'),
        nestLogs: () => nest.lines.slice(from.nest).join('\n'),
      };
    }

    function expectNoLeak(logs: string, key: string, secret: string) {
      expect(logs).not.toContain(key);
      expect(logs).not.toContain(secret);
      // A bytea shows up in hex, e.g. in pg's "Failing row contains (...)" detail.
      expect(logs).not.toContain(Buffer.from(secret).toString('hex'));
    }

    it('a success and its replay: the module statements are logged with redacted parameters, the app query as it is', async () => {
      const first = await request(fresh());
      expect(first.res.status).toBe(201);
      expect(first.res.json().note.secret).toBe(first.secret);
      const replay = await post(api.url, '/items', { label: first.label, secret: first.secret }, first.key);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      const logs = first.typeormLogs();
      expect(logs).toContain('nest-idempotency:claim');
      expect(logs).toContain('nest-idempotency:complete');
      expect(logs).toContain('[redacted]');
      // The application's own query keeps its parameters: only the module's are redacted.
      expect(logs).toContain(first.label);
      expectNoLeak(logs, first.key, first.secret);
      expectNoLeak(first.nestLogs(), first.key, first.secret);
    });

    it("a unique violation on the claim (pg's detail quotes the key) is logged without the key", async () => {
      // A second unique index the claim's ON CONFLICT does not arbitrate: another tenant's claim of the key violates it.
      await db.query('CREATE UNIQUE INDEX IF NOT EXISTS redaction_key_only ON idempotency_keys (key)');
      try {
        const label = fresh();
        const taken = await request(label, 'tenant-a');
        expect(taken.res.status).toBe(201);
        const clash = await request(label, 'tenant-b');
        expect(clash.res.status).toBeGreaterThanOrEqual(500);
        const logs = clash.typeormLogs();
        expect(logs).toContain('query-error');
        expect(logs).toContain('23505');
        expectNoLeak(logs, clash.key, clash.secret);
        expectNoLeak(clash.nestLogs(), clash.key, clash.secret);
      } finally {
        await db.query('DROP INDEX IF EXISTS redaction_key_only');
      }
    });

    it('a check violation on the completion (its parameters hold the stored body) is logged without key or body', async () => {
      const label = fresh();
      await db.query(
        `ALTER TABLE idempotency_keys ADD CONSTRAINT redaction_no_completion CHECK (status <> 'completed' OR key <> $$key-${label}$$)`,
      );
      try {
        const failed = await request(label);
        expect(failed.res.status).toBeGreaterThanOrEqual(500);
        const logs = failed.typeormLogs();
        expect(logs).toContain('query-error');
        expect(logs).toContain('23514');
        expectNoLeak(logs, failed.key, failed.secret);
        expectNoLeak(failed.nestLogs(), failed.key, failed.secret);
      } finally {
        await db.query('ALTER TABLE idempotency_keys DROP CONSTRAINT redaction_no_completion');
      }
    });

    it("a claim that fails on a broken key table is logged, and Nest's exception log carries neither key nor body", async () => {
      await db.query('ALTER TABLE idempotency_keys RENAME COLUMN fingerprint TO fingerprint_renamed');
      try {
        const failed = await request(fresh());
        expect(failed.res.status).toBeGreaterThanOrEqual(500);
        const logs = failed.typeormLogs();
        expect(logs).toContain('query-error');
        expect(logs).toContain('nest-idempotency:claim');
        expectNoLeak(logs, failed.key, failed.secret);
        const nestLogs = failed.nestLogs();
        // The error reached Nest's log (so this assertion can fail), only without the parameters.
        expect(nestLogs).toContain('fingerprint');
        expectNoLeak(nestLogs, failed.key, failed.secret);
      } finally {
        await db.query('ALTER TABLE idempotency_keys RENAME COLUMN fingerprint_renamed TO fingerprint');
      }
    });
  });
});

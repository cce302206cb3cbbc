import { readFileSync } from 'node:fs';
import { describe, expect, it } from '@jest/globals';
import { KEY_FUNCTIONS_VERSION } from '../src/store/key-function-parts.sql.js';
import { createTableStatements } from '../src/store/sql.js';
import { KEY_TABLE_SQL_FILE, keyTableMigrationStatements, renderKeyTableSql } from '../scripts/render-key-table-sql.js';

const committed = readFileSync(KEY_TABLE_SQL_FILE, 'utf8');

describe('sql/idempotency-keys.sql', () => {
  it('is what `npm run key-table-sql` makes from the migration now (run it and commit the file when this fails)', async () => {
    expect(committed).toBe(await renderKeyTableSql());
  });

  it('holds every statement of the default key table, in order, after the lock the migration takes', async () => {
    const statements = await keyTableMigrationStatements();
    expect(statements[0]).toBe("SELECT pg_advisory_xact_lock(hashtextextended('nest-idempotency:migrate:idempotency_keys', 0))");
    expect(statements.slice(1)).toEqual(createTableStatements('idempotency_keys'));
    let from = 0;
    for (const statement of statements) {
      const at = committed.indexOf(`${statement};`, from);
      expect(at).toBeGreaterThanOrEqual(from);
      from = at + statement.length;
    }
  });

  it('names the package version, the key functions version and the table it makes', () => {
    const { version } = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string };
    const header = committed.slice(0, committed.indexOf('\n\n'));
    expect(header).toContain(`nest-idempotency-pg ${version},`);
    expect(header).toContain(KEY_FUNCTIONS_VERSION);
    expect(header.replace(/\n-- /g, ' ')).toContain('under the default name idempotency_keys');
    expect(header.split('\n').every((line) => line.startsWith('--'))).toBe(true);
  });

  it('is parted where drizzle-kit parts it, between the statements', () => {
    const parts = committed.split('--> statement-breakpoint');
    expect(parts).toHaveLength(createTableStatements('idempotency_keys').length + 1);
    for (const part of parts) expect(part.trim()).toMatch(/;$/);
  });
});

// `npm run key-table-sql`: writes sql/idempotency-keys.sql from the key table's migration (see
// render-key-table-sql.ts). `npm run key-table-sql -- --check` writes nothing and fails when the
// committed file differs from what the migration makes now (test/key-table-sql.spec.ts checks the same).
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, relative } from 'node:path';
import { KEY_TABLE_SQL_FILE, renderKeyTableSql } from './render-key-table-sql.js';

const path = fileURLToPath(KEY_TABLE_SQL_FILE);
const shown = relative(process.cwd(), path);
const rendered = await renderKeyTableSql();
const committed = existsSync(path) ? readFileSync(path, 'utf8') : undefined;

if (process.argv.includes('--check')) {
  if (committed !== rendered) {
    console.error(`${shown} differs from what the key table's migration creates: run \`npm run key-table-sql\` and commit it.`);
    process.exitCode = 1;
  } else {
    console.log(`${shown} is what the key table's migration creates.`);
  }
} else if (committed === rendered) {
  console.log(`${shown} is up to date.`);
} else {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, rendered);
  console.log(`wrote ${shown}`);
}

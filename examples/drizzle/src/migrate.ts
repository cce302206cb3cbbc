import { drizzle } from 'drizzle-orm/node-postgres';
import { migrate } from 'drizzle-orm/node-postgres/migrator';
import { Pool } from 'pg';

// `npm run migrate`, before the app starts: applies drizzle/ (the SQL drizzle-kit generates from src/schema.ts) with
// drizzle-orm's own migrator. The key table is not among them: the app's start-up makes it (`migrate: true` in app.module.ts).
const pool = new Pool({ connectionString: process.env.DATABASE_URL });
try {
  await migrate(drizzle(pool), { migrationsFolder: 'drizzle' });
} finally {
  await pool.end();
}

import { drizzle } from 'drizzle-orm/node-postgres';
import { Pool } from 'pg';
import { schema } from './schema.js';

/** The app's pool: its Drizzle database's, and the idempotency module's own statements and transactions. */
export const pool = new Pool({ connectionString: process.env.DATABASE_URL });

/** The app's Drizzle database: what runs outside an idempotent request goes through it as it is. */
export const db = drizzle(pool, { schema });

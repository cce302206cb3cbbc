import { drizzle } from 'drizzle-orm/node-postgres';
import { Pool } from 'pg';
import { schema } from './schema.js';

/** The app's Drizzle database on its own pool: what runs outside an idempotent request goes through it. */
export const db = drizzle(new Pool({ connectionString: process.env.DATABASE_URL }), { schema });

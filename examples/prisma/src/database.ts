import pg from 'pg';

/** The app's pool: under its PrismaClient (wrapped, see prisma.service.ts), and the idempotency module's own statements. */
export const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });

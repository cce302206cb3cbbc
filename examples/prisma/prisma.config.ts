import { defineConfig } from 'prisma/config';

// Prisma 7 reads the database's URL from here (for `prisma migrate deploy`), no longer from the schema.
export default defineConfig({
  schema: 'prisma/schema.prisma',
  migrations: { path: 'prisma/migrations' },
  datasource: { url: process.env.DATABASE_URL ?? '' },
});

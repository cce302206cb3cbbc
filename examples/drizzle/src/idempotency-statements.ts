import { TypeOrmModule } from '@nestjs/typeorm';
import { CreateIdempotencyKeys1764460800000, migratingDataSourceFactory } from 'nest-idempotency-pg';

/**
 * Where the idempotency module runs its own statements (the claim, the key's transaction, its completion): a TypeORM
 * data source on the app's database, with no entities of the app's. Its migration creates the key table at start-up,
 * once however many instances start. The app's writes never go through it.
 */
export const IdempotencyStatementsModule = TypeOrmModule.forRootAsync({
  useFactory: () => ({ type: 'postgres', url: process.env.DATABASE_URL, migrations: [CreateIdempotencyKeys1764460800000] }),
  dataSourceFactory: migratingDataSourceFactory(),
});

import { Module } from '@nestjs/common';
import { ScheduleModule } from '@nestjs/schedule';
import { IdempotencyModule } from 'nest-idempotency-pg';
import { IdempotencyDrizzleModule } from 'nest-idempotency-pg/drizzle';
import { db } from './database.js';
import { IdempotencyStatementsModule } from './idempotency-statements.js';
import { PayoutsController } from './payouts.controller.js';
import { PayoutsService } from './payouts.service.js';

@Module({
  imports: [
    IdempotencyStatementsModule, // the module's own statements: TypeORM on the same database (idempotency-statements.ts)
    IdempotencyModule.forRoot({
      // Whose keys these are: one tenant here; a real app takes it from its auth guard's principal.
      tenant: () => 'default',
    }),
    IdempotencyDrizzleModule.forRoot({ db }),
    ScheduleModule.forRoot(), // runs the module's sweeper of expired keys
  ],
  controllers: [PayoutsController],
  providers: [PayoutsService],
})
export class AppModule {}

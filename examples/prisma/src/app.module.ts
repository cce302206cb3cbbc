import { Module } from '@nestjs/common';
import { ScheduleModule } from '@nestjs/schedule';
import { IdempotencyModule } from 'nest-idempotency-pg';
import { pool } from './database.js';
import { PayoutsController } from './payouts.controller.js';
import { PayoutsService } from './payouts.service.js';
import { PrismaService } from './prisma.service.js';

@Module({
  imports: [
    IdempotencyModule.forRoot({
      pool, // the module's statements and transactions: the pool itself, not idempotentPool(pool), which is Prisma's
      migrate: true, // the key table, created at start-up, once however many instances start
      // Whose keys these are: one tenant here; a real app takes it from its auth guard's principal.
      tenant: () => 'default',
    }),
    ScheduleModule.forRoot(), // runs the module's sweeper of expired keys
  ],
  controllers: [PayoutsController],
  providers: [PrismaService, PayoutsService],
})
export class AppModule {}

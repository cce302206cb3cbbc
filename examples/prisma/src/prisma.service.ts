import { Injectable, type OnModuleDestroy } from '@nestjs/common';
import { PrismaPg } from '@prisma/adapter-pg';
import { idempotentPool } from 'nest-idempotency-pg/pg-pool';
import { pool } from './database.js';
import { PrismaClient } from './generated/prisma/client.js';

@Injectable()
export class PrismaService extends PrismaClient implements OnModuleDestroy {
  constructor() {
    // The one change for idempotency: inside an @Idempotent() handler, this client's statements run in the key's transaction.
    super({ adapter: new PrismaPg(idempotentPool(pool)) });
  }

  onModuleDestroy() {
    return this.$disconnect();
  }
}

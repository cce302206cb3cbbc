/**
 * The bench app's routes on the data layers of issue 29: the charge written through the app's own Prisma client
 * (`@prisma/adapter-pg` on `idempotentPool`) or its own Drizzle database (`DrizzleTransactionHost#db`), as
 * docs/transactions.md sets them up. Each layer has the same handler twice, without and with `@Idempotent()`:
 *   POST /prisma-bare/charges    `prisma.charge.create()`, no module: one statement on the app's pool, committed alone
 *   POST /prisma-idem/charges    the same under @Idempotent(): in the key's transaction, on the module's connection
 *   POST /drizzle-bare/charges   `db.insert(charges)`, no module
 *   POST /drizzle-idem/charges   the same under @Idempotent()
 * The app's pools connect as the bench app, so their backends' CPU counts as the app's PostgreSQL CPU.
 */
import { Body, Controller, Inject, Post, type DynamicModule, type Provider } from '@nestjs/common';
import { PrismaPg } from '@prisma/adapter-pg';
import { drizzle } from 'drizzle-orm/node-postgres';
import { bigserial, integer, pgTable, text, timestamp } from 'drizzle-orm/pg-core';
import pg from 'pg';
import { Idempotent } from '../src/index.js';
import { DrizzleTransactionHost, IdempotencyDrizzleModule } from '../src/integrations/drizzle/index.js';
import { idempotentPool } from '../src/integrations/pg-pool/index.js';
import { chargeView, type ChargeBody } from './charge.js';
import { CHARGES_TABLE } from './database.js';
import { PrismaClient } from './prisma/generated/client.js';
import { APP_APPLICATION_NAME } from './protocol.js';

/** The charges table as Drizzle's schema (bench/database.ts creates it); found through the bench schema's search_path. */
const charges = pgTable(CHARGES_TABLE, {
  id: bigserial('id', { mode: 'bigint' }).primaryKey(),
  amount: integer('amount').notNull(),
  currency: text('currency').notNull(),
  customer: text('customer').notNull(),
  createdAt: timestamp('created_at', { withTimezone: true }).notNull().defaultNow(),
});
const schema = { charges };

const PRISMA = Symbol('bench prisma client');

@Controller()
export class LayerChargesController {
  constructor(
    @Inject(PRISMA) private readonly prisma: PrismaClient,
    private readonly drizzle: DrizzleTransactionHost<typeof schema>,
  ) {}

  @Post('prisma-bare/charges')
  prismaBare(@Body() body: ChargeBody) {
    return this.prismaCharge(body);
  }

  @Post('prisma-idem/charges')
  @Idempotent()
  prismaIdempotent(@Body() body: ChargeBody) {
    return this.prismaCharge(body);
  }

  @Post('drizzle-bare/charges')
  drizzleBare(@Body() body: ChargeBody) {
    return this.drizzleCharge(body);
  }

  @Post('drizzle-idem/charges')
  @Idempotent()
  drizzleIdempotent(@Body() body: ChargeBody) {
    return this.drizzleCharge(body);
  }

  private async prismaCharge(body: ChargeBody) {
    const row = await this.prisma.charge.create({
      data: { amount: body.amount, currency: body.currency, customer: body.customer },
    });
    return chargeView(String(row.id), row.createdAt, body);
  }

  private async drizzleCharge(body: ChargeBody) {
    const [row] = await this.drizzle.db
      .insert(charges)
      .values({ amount: body.amount, currency: body.currency, customer: body.customer })
      .returning();
    return chargeView(String(row.id), row.createdAt, body);
  }
}

/**
 * The app's own pg pool, as large as the module's: the bare routes' statements run on it, and the module routes'
 * outside nothing (inside an execution they run on the module's connection).
 */
function appPool(schema: string, poolSize: number): pg.Pool {
  return new pg.Pool({
    connectionString: process.env.DATABASE_URL,
    application_name: APP_APPLICATION_NAME,
    options: `-c search_path=${schema}`,
    max: poolSize,
    connectionTimeoutMillis: 10_000,
  });
}

/** The Prisma client and the Drizzle integration of the layer routes, on pools of their own. */
export function layerRoutes(schemaName: string, poolSize: number): { imports: DynamicModule[]; providers: Provider[] } {
  const prisma: Provider = {
    provide: PRISMA,
    // Prisma names the schema in its SQL (`"bench"."bench_charges"`); `schema` says which.
    useFactory: () =>
      new PrismaClient({ adapter: new PrismaPg(idempotentPool(appPool(schemaName, poolSize)), { schema: schemaName }) }),
  };
  const db = drizzle(appPool(schemaName, poolSize), { schema });
  return { imports: [IdempotencyDrizzleModule.forRoot({ db })], providers: [prisma] };
}

import { Body, Controller, Headers, Module, Post } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import {
  CreateIdempotencyKeys1764460800000,
  Idempotent,
  IdempotencyModule,
  migratingDataSourceFactory,
  TransactionHost,
} from 'nest-idempotency-pg';
import type { MigrationInterface, QueryRunner } from 'typeorm';

/** The app's own table, created by its own migration beside the module's. */
export class CreateOrders1700000000000 implements MigrationInterface {
  async up(runner: QueryRunner): Promise<void> {
    await runner.query(`CREATE TABLE orders (
      id bigserial PRIMARY KEY, tenant text NOT NULL, item text NOT NULL, quantity integer NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now())`);
  }
  async down(runner: QueryRunner): Promise<void> {
    await runner.query('DROP TABLE orders');
  }
}

interface CreateOrder {
  item: string;
  quantity: number;
}

@Controller('orders')
export class OrdersController {
  constructor(private readonly tx: TransactionHost) {}

  /** The insert commits with the key: a replay returns this response and inserts nothing. */
  @Post()
  @Idempotent()
  async create(@Body() order: CreateOrder, @Headers('x-tenant') tenant: string) {
    const [row] = (await this.tx.manager.query(
      'INSERT INTO orders (tenant, item, quantity) VALUES ($1, $2, $3) RETURNING id, item, quantity, created_at',
      [tenant, order.item, order.quantity],
    )) as Array<{ id: string; item: string; quantity: number; created_at: Date }>;
    return { id: row.id, item: row.item, quantity: row.quantity, createdAt: row.created_at.toISOString() };
  }
}

@Module({
  imports: [
    TypeOrmModule.forRootAsync({
      useFactory: () => ({
        type: 'postgres',
        url: process.env.DATABASE_URL,
        schema: process.env.DATABASE_SCHEMA,
        // The module's plain SQL finds its table through search_path, like the entities through `schema`.
        extra: { options: `-c search_path=${process.env.DATABASE_SCHEMA ?? 'public'}` },
        migrations: [CreateIdempotencyKeys1764460800000, CreateOrders1700000000000],
      }),
      dataSourceFactory: migratingDataSourceFactory(),
    }),
    IdempotencyModule.forRoot({
      tenant: (ctx) => ctx.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-tenant'],
      // The scheduled sweeper needs @nestjs/schedule, an optional peer this app does not install.
      sweep: false,
    }),
  ],
  controllers: [OrdersController],
})
export class AppModule {}

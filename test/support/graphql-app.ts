import { BadRequestException, Module, type INestApplication, type LoggerService } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ApolloDriver, type ApolloDriverConfig } from '@nestjs/apollo';
import { Args, Field, GraphQLModule, ID, InputType, Int, Mutation, ObjectType, Query, Resolver } from '@nestjs/graphql';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { TypeOrmModule } from '@nestjs/typeorm';
import { GraphQLError } from 'graphql';
import { Idempotent, IdempotencyModule, TransactionHost, type IdempotencyModuleOptions } from '../../src/index.js';
import { dataSourceOptions } from './database.js';
import { sleep } from './http.js';
import type { AdapterName } from './test-app.js';

@ObjectType()
class Refund {
  @Field(() => ID) id!: string;
  @Field(() => String) label!: string;
  @Field(() => Int) amount!: number;
  @Field(() => Int) invocation!: number;
  @Field(() => String) createdAt!: string;
}

@InputType()
class RefundInput {
  @Field(() => String) label!: string;
  @Field(() => Int) amount!: number;
  @Field(() => Int, { nullable: true }) delayMs?: number;
}

/** What the resolvers did, seen from inside the process. */
export class ResolverProbe {
  readonly invocations = new Map<string, number>();
  record(label: string): number {
    const n = (this.invocations.get(label) ?? 0) + 1;
    this.invocations.set(label, n);
    return n;
  }
  count(label: string): number {
    return this.invocations.get(label) ?? 0;
  }
}

function resolvers(probe: ResolverProbe) {
  @Resolver(() => Refund)
  class RefundsResolver {
    constructor(private readonly tx: TransactionHost) {}

    @Query(() => String)
    health(): string {
      return 'ok';
    }

    private async create(input: RefundInput): Promise<Refund> {
      const invocation = probe.record(input.label);
      const [row] = (await this.tx.manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2) RETURNING id, created_at', [
        'graphql',
        input.label,
      ])) as Array<{ id: string; created_at: Date }>;
      if (input.delayMs) await sleep(input.delayMs);
      return { id: row.id, label: input.label, amount: input.amount, invocation, createdAt: row.created_at.toISOString() };
    }

    @Mutation(() => Refund)
    @Idempotent()
    refund(@Args('input', { type: () => RefundInput }) input: RefundInput): Promise<Refund> {
      return this.create(input);
    }

    @Mutation(() => Refund)
    @Idempotent({ key: 'requestId' })
    refundByArgument(
      @Args('requestId', { type: () => String }) _requestId: string,
      @Args('input', { type: () => RefundInput }) input: RefundInput,
    ): Promise<Refund> {
      return this.create(input);
    }

    @Mutation(() => Refund)
    @Idempotent()
    async declineRefund(@Args('input', { type: () => RefundInput }) input: RefundInput): Promise<Refund> {
      await this.create(input);
      throw new GraphQLError('The charge cannot be refunded.', { extensions: { code: 'REFUND_DECLINED' } });
    }

    @Mutation(() => Refund)
    @Idempotent({ lease: 800 })
    async failRefund(@Args('input', { type: () => RefundInput }) input: RefundInput): Promise<Refund> {
      await this.create(input);
      throw new Error('the payment provider exploded');
    }

    @Mutation(() => Refund)
    @Idempotent()
    async validatedRefund(@Args('input', { type: () => RefundInput }) input: RefundInput): Promise<Refund> {
      return this.create(input);
    }
  }
  return RefundsResolver;
}

/** `@Idempotent()` on the class rather than on each mutation: the same policies must apply to its handlers. */
function classLevelResolver(probe: ResolverProbe) {
  @Resolver()
  @Idempotent()
  class PayoutsResolver {
    constructor(private readonly tx: TransactionHost) {}

    @Mutation(() => String)
    async failPayout(@Args('label', { type: () => String }) label: string): Promise<string> {
      probe.record(label);
      await this.tx.manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['graphql', label]);
      throw new Error('the payout provider exploded');
    }
  }
  return PayoutsResolver;
}

/** Rejects before the resolver body runs, as a ValidationPipe would: the key is released. */
function rejectNegativeAmounts() {
  return {
    transform(value: unknown) {
      if (value && typeof value === 'object' && (value as RefundInput).amount < 0) throw new BadRequestException('amount < 0');
      return value;
    },
  };
}

export interface GraphQLTestApp {
  app: INestApplication;
  url: string;
  probe: ResolverProbe;
  close(): Promise<void>;
}

/** The refunds GraphQL API (Apollo) on a real port, the request and response in the GraphQL context. */
export async function startGraphQLApp(
  adapter: AdapterName,
  schema: string,
  options: Partial<IdempotencyModuleOptions> = {},
  /** The app's logger; none by default. */
  logger: LoggerService | false = false,
): Promise<GraphQLTestApp> {
  const probe = new ResolverProbe();
  @Module({
    imports: [
      TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }),
      GraphQLModule.forRoot<ApolloDriverConfig>({
        driver: ApolloDriver,
        autoSchemaFile: true,
        // Express integration: ({ req, res }); Fastify integration: (request, reply).
        context: (first: { req?: unknown; res?: unknown }, reply?: unknown) =>
          first.req ? { req: first.req, res: first.res } : { req: first, reply },
        includeStacktraceInErrorResponses: false,
      }),
      IdempotencyModule.forRoot({
        tenant: (ctx) => {
          const gql = ctx.getArgByIndex<{ req?: { headers: Record<string, string | undefined> } }>(2);
          return gql?.req?.headers['x-tenant'];
        },
        sweep: false,
        ...options,
      }),
    ],
    providers: [resolvers(probe), classLevelResolver(probe)],
  })
  class GraphQLTestModule {}

  const app =
    adapter === 'express'
      ? await NestFactory.create(GraphQLTestModule, new ExpressAdapter(), { logger, abortOnError: false })
      : await NestFactory.create(GraphQLTestModule, new FastifyAdapter(), { logger, abortOnError: false });
  app.useGlobalPipes(rejectNegativeAmounts());
  await app.listen(0, '127.0.0.1');
  const url = (await app.getUrl()).replace('[::1]', '127.0.0.1');
  return { app, url, probe, close: () => app.close() };
}

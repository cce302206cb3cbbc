import {
  Body,
  Controller,
  GatewayTimeoutException,
  HttpException,
  Inject,
  Injectable,
  Param,
  Post,
  Res,
  ServiceUnavailableException,
  type Type,
} from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { InjectDataSource } from '@nestjs/typeorm';
import { Exclude, Expose } from 'class-transformer';
import { IsIn, IsInt, IsOptional, IsString, Length, Max, Min } from 'class-validator';
import type { DataSource } from 'typeorm';
import { TransactionHost, type IdempotencyRouteOptions } from '../../src/index.js';
import { Unwrapped } from './app-wide.js';

/**
 * The library's decorators, passed in so the same controllers can be built
 * with the module and without it (where they do nothing and every route still
 * exists).
 */
export interface IdempotencyDecorators {
  Idempotent(options?: IdempotencyRouteOptions): ClassDecorator & MethodDecorator;
  SkipIdempotency(skip?: boolean): ClassDecorator & MethodDecorator;
}

const inert = (() => undefined) as unknown as ClassDecorator & MethodDecorator;
export const WITHOUT_IDEMPOTENCY: IdempotencyDecorators = { Idempotent: () => inert, SkipIdempotency: () => inert };

/** Effect rows: `ledger` rows are the app's writes (through the request's transaction), `provider` rows the calls out. */
export const EFFECT_KINDS = { ledger: 'ledger', provider: 'provider' } as const;

/** The app's own writes, through the request's transaction when there is one (else the data source's manager). */
@Injectable()
export class Ledger {
  constructor(private readonly tx: TransactionHost) {}

  async record(label: string): Promise<void> {
    await this.tx.manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', [EFFECT_KINDS.ledger, label]);
  }
}

/**
 * A payment provider's SDK: another company's system, so each call is
 * recorded on a connection of its own, outside the request's transaction,
 * and no rollback undoes it. Counting these rows counts the calls out.
 */
@Injectable()
export class PaymentProvider {
  constructor(@InjectDataSource() private readonly dataSource: DataSource) {}

  async charge(label: string): Promise<void> {
    await this.dataSource.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', [EFFECT_KINDS.provider, label]);
  }
}

/** What Node's http client throws when the provider drops the socket. */
function socketReset(): Error {
  return Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET', errno: -104, syscall: 'read' });
}

export class CreateChargeDto {
  @IsString() @Length(1, 100) label!: string;
  @IsInt() @Min(1) @Max(100_000_000) amount!: number;
  @IsOptional() @IsIn(['usd', 'eur']) currency?: string;
  @IsOptional() @IsString() description?: string;
}

export class LabelDto {
  @IsString() @Length(1, 100) label!: string;
  @IsOptional() @IsString() description?: string;
}

export class Charge {
  id!: string;
  object = 'charge';
  amount!: number;
  currency!: string;
  description!: string | null;
  /** Internal: never in a response, a replay or a stored response. */
  @Exclude() riskScore!: number;

  constructor(fields: Omit<Charge, 'object' | 'amountDisplay'>) {
    Object.assign(this, fields);
  }

  @Expose()
  get amountDisplay(): string {
    return `${(this.amount / 100).toFixed(2)} ${this.currency.toUpperCase()}`;
  }
}

export class Refund {
  id!: string;
  object = 'refund';
  charge!: string;
  @Exclude() ledgerAccount!: string;

  constructor(fields: Omit<Refund, 'object'>) {
    Object.assign(this, fields);
  }
}

export class Receipt {
  label!: string;
  controller!: string;
  @Exclude() auditTrail!: string;

  constructor(fields: Receipt) {
    Object.assign(this, fields);
  }
}

/** The shop's controllers, decorated with `decorators`: built anew for each app, since decorators change the classes. */
export function shopControllers({ Idempotent, SkipIdempotency }: IdempotencyDecorators): Type[] {
  @Controller('charges')
  class ChargesController {
    constructor(
      private readonly ledger: Ledger,
      private readonly provider: PaymentProvider,
      private readonly adapterHost: HttpAdapterHost,
    ) {}

    @Post()
    @Idempotent()
    async create(@Body() dto: CreateChargeDto, @Res({ passthrough: true }) res: unknown): Promise<Charge> {
      await this.ledger.record(dto.label);
      await this.provider.charge(dto.label);
      const id = `ch_${dto.label}`;
      this.adapterHost.httpAdapter.setHeader(res, 'Location', `/charges/${id}`);
      return new Charge({
        id,
        amount: dto.amount,
        currency: dto.currency ?? 'usd',
        description: dto.description ?? null,
        riskScore: 0.87,
      });
    }

    @Post(':chargeId/refunds')
    @Idempotent()
    async refund(@Param('chargeId') chargeId: string, @Body() dto: LabelDto): Promise<Refund> {
      await this.ledger.record(dto.label);
      return new Refund({ id: `re_${dto.label}`, charge: chargeId, ledgerAccount: 'acct_internal_4711' });
    }

    /** A declined card: a definite answer from the provider, whose SDK kept the socket error as the cause. */
    @Post('declined')
    @Idempotent()
    async declined(@Body() dto: LabelDto): Promise<never> {
      await this.ledger.record(dto.label);
      await this.provider.charge(dto.label);
      throw new HttpException({ message: 'Your card was declined.', code: 'card_declined' }, 402, { cause: socketReset() });
    }

    /** The provider dropped the socket mid-call: whether it charged is unknown. */
    @Post('provider-reset')
    @Idempotent()
    async providerReset(@Body() dto: LabelDto): Promise<never> {
      await this.ledger.record(dto.label);
      await this.provider.charge(dto.label);
      throw socketReset();
    }

    @Post('provider-timeout')
    @Idempotent()
    async providerTimeout(@Body() dto: LabelDto): Promise<never> {
      await this.ledger.record(dto.label);
      await this.provider.charge(dto.label);
      throw new Error('The payment provider did not answer.', { cause: { code: 'ETIMEDOUT' } });
    }

    @Post('gateway-timeout')
    @Idempotent()
    async gatewayTimeout(@Body() dto: LabelDto): Promise<never> {
      await this.ledger.record(dto.label);
      await this.provider.charge(dto.label);
      throw new GatewayTimeoutException('The payment provider did not answer in time.');
    }

    @Post('provider-down')
    @Idempotent()
    async providerDown(@Body() dto: LabelDto): Promise<never> {
      await this.ledger.record(dto.label);
      throw new ServiceUnavailableException('Payments are paused for maintenance.');
    }
  }

  @Controller('notes')
  class NotesController {
    constructor(private readonly ledger: Ledger) {}

    @Post()
    @Idempotent()
    async create(@Body() dto: LabelDto): Promise<string> {
      await this.ledger.record(dto.label);
      return `Saved note ${dto.label} ✓`;
    }

    @Post('plain')
    @Idempotent()
    @Unwrapped()
    async plain(@Body() dto: LabelDto): Promise<string> {
      await this.ledger.record(dto.label);
      return `Saved note ${dto.label} ✓`;
    }
  }

  /**
   * Routes declared once and served by two controllers. `one`/`two` get
   * idempotency from the subclass's class decorator; `marked-*` carry it on
   * the shared method itself, so both subclasses serve the same handler function.
   */
  class BaseController {
    // Property injection: subclasses without a constructor of their own get no constructor parameter types.
    @Inject(Ledger) protected readonly ledger!: Ledger;

    @Post('one')
    async one(@Body() dto: LabelDto): Promise<Receipt> {
      return this.receipt(dto);
    }

    @Post('two')
    async two(@Body() dto: LabelDto): Promise<Receipt> {
      return this.receipt(dto);
    }

    @Post('marked-one')
    @Idempotent()
    async markedOne(@Body() dto: LabelDto): Promise<Receipt> {
      return this.receipt(dto);
    }

    @Post('marked-two')
    @Idempotent()
    async markedTwo(@Body() dto: LabelDto): Promise<Receipt> {
      return this.receipt(dto);
    }

    private async receipt(dto: LabelDto): Promise<Receipt> {
      await this.ledger.record(dto.label);
      return new Receipt({ label: dto.label, controller: this.constructor.name, auditTrail: 'internal' });
    }
  }

  @Controller('guarded')
  @Idempotent()
  class GuardedController extends BaseController {}

  @Controller('skipped')
  @Idempotent()
  @SkipIdempotency()
  class SkippedController extends BaseController {}

  return [ChargesController, NotesController, GuardedController, SkippedController];
}

import { Body, Controller, Get, NotFoundException, Param, Post, Query, Res } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { Idempotent } from '../../src/index.js';
import { CurrentTenant } from '../auth/tenant.decorator.js';
import type { Charge, ChargeList } from './charge.view.js';
import { ChargesService } from './charges.service.js';
import { CreateChargeDto } from './create-charge.dto.js';
import { DEFAULT_LIST_LIMIT, ListChargesQuery } from './list-charges.query.js';

@Controller('charges')
export class ChargesController {
  constructor(
    private readonly charges: ChargesService,
    private readonly adapterHost: HttpAdapterHost,
  ) {}

  /**
   * Idempotent with a required `Idempotency-Key`: a retry gets the stored
   * response (Location included) instead of a second charge.
   */
  @Post()
  @Idempotent()
  async create(
    @CurrentTenant() tenant: string,
    @Body() input: CreateChargeDto,
    // passthrough: Nest still sends the return value, through the global ClassSerializerInterceptor.
    @Res({ passthrough: true }) response: unknown,
  ): Promise<Charge> {
    const charge = await this.charges.create(tenant, input);
    // Through the HTTP adapter so Express and Fastify alike; the module stores and replays Location.
    this.adapterHost.httpAdapter.setHeader(response, 'Location', `/charges/${charge.id}`);
    return charge;
  }

  @Get()
  list(@CurrentTenant() tenant: string, @Query() query: ListChargesQuery): Promise<ChargeList> {
    return this.charges.list(tenant, query.limit ?? DEFAULT_LIST_LIMIT);
  }

  @Get(':id')
  async get(@CurrentTenant() tenant: string, @Param('id') id: string): Promise<Charge> {
    const charge = await this.charges.get(tenant, id);
    // Another tenant's charge is as absent as one that never existed, and so is an id that cannot exist.
    if (!charge) throw new NotFoundException('No such charge.');
    return charge;
  }
}

import { Module } from '@nestjs/common';
import { SimulatedCardProcessor } from './card-processor.js';
import { ChargesController } from './charges.controller.js';
import { ChargesService } from './charges.service.js';

@Module({
  controllers: [ChargesController],
  providers: [ChargesService, SimulatedCardProcessor],
})
export class ChargesModule {}

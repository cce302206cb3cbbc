import { Type } from 'class-transformer';
import {
  IsIn,
  IsInt,
  IsObject,
  IsOptional,
  IsString,
  Length,
  Matches,
  Max,
  Min,
  ValidateBy,
  ValidateNested,
  type ValidationOptions,
} from 'class-validator';
import type { JsonObject } from './json.js';

export const SIMULATED_OUTCOMES = ['decline', 'error', 'network', 'unavailable'] as const;
export type SimulatedOutcome = (typeof SIMULATED_OUTCOMES)[number];

/**
 * PostgreSQL `text` cannot hold U+0000 and `jsonb` rejects `\u0000`: such
 * input would fail the insert with a 500 and leave the key in flight, so it
 * is refused up front as a 400 (which releases the key).
 */
function HasNoNulCharacter(options?: ValidationOptions): PropertyDecorator {
  return ValidateBy(
    {
      name: 'hasNoNulCharacter',
      validator: {
        validate: (value: unknown) => !(JSON.stringify(value) ?? '').includes('\\u0000'),
        defaultMessage: (args) => `${args?.property ?? 'value'} must not contain the character U+0000`,
      },
    },
    options,
  );
}

/** Test hooks of the simulated card processor. */
export class SimulateDto {
  /** How long the processor takes, after the charge row is written. */
  @IsOptional()
  @IsInt()
  @Min(0)
  @Max(60_000)
  delayMs?: number;

  /**
   * `decline` answers 402 (stored and replayed); `error` throws a plain error and `network` a dropped
   * connection's (both 500, key stays in flight); `unavailable` answers 503 (key stays in flight, not stored).
   */
  @IsOptional()
  @IsIn(SIMULATED_OUTCOMES)
  outcome?: SimulatedOutcome;
}

export class CreateChargeDto {
  /** In the currency's minor unit. */
  @IsInt()
  @Min(1)
  @Max(100_000_000)
  amount!: number;

  @IsString()
  @Matches(/^[a-z]{3}$/, { message: 'currency must be three lowercase letters (ISO 4217), e.g. "usd"' })
  currency!: string;

  @IsString()
  @Length(1, 100)
  @HasNoNulCharacter()
  customer!: string;

  @IsOptional()
  @IsString()
  @HasNoNulCharacter()
  description?: string | null;

  @IsOptional()
  @IsObject()
  @HasNoNulCharacter()
  metadata?: JsonObject | null;

  @IsOptional()
  @IsObject()
  @ValidateNested()
  @Type(() => SimulateDto)
  simulate?: SimulateDto | null;
}

import { Type } from 'class-transformer';
import { IsInt, IsOptional, Max, Min } from 'class-validator';

export const DEFAULT_LIST_LIMIT = 100;

export class ListChargesQuery {
  /** Newest first; at most this many charges in `data` (`count` still counts them all). */
  @IsOptional()
  @Type(() => Number)
  @IsInt()
  @Min(1)
  @Max(DEFAULT_LIST_LIMIT)
  limit?: number;
}

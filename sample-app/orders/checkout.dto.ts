import { IsEmail, IsInt, IsString, Length, Matches, Max, Min } from 'class-validator';

export class CheckoutDto {
  @IsInt() @Min(1) @Max(100_000_000) amount!: number;
  @Matches(/^[a-z]{3}$/) currency!: string;
  @IsString() @Length(1, 100) customer!: string;
  @IsEmail() email!: string;
}

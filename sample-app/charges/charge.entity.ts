import { Column, CreateDateColumn, Entity, Index, PrimaryColumn } from 'typeorm';
import type { JsonObject } from './json.js';

/** A row of `charges`; created by the `CreateCharges` migration, never by `synchronize`. */
@Entity({ name: 'charges' })
@Index('charges_tenant_created_idx', ['tenantId', 'created', 'id'])
export class ChargeEntity {
  @PrimaryColumn({ type: 'text' })
  id!: string;

  /** The owning tenant; every read filters on it. Never part of the API response. */
  @Column({ name: 'tenant_id', type: 'text' })
  tenantId!: string;

  /** In the currency's minor unit (cents). */
  @Column({ type: 'integer' })
  amount!: number;

  @Column({ type: 'text' })
  currency!: string;

  @Column({ type: 'text' })
  customer!: string;

  @Column({ type: 'text', nullable: true })
  description!: string | null;

  @Column({ type: 'jsonb' })
  metadata!: JsonObject;

  @Column({ type: 'text' })
  status!: 'succeeded';

  /** 0 (safe) to 100; internal, never in a response. Null on charges made before the fraud screen existed. */
  @Column({ name: 'risk_score', type: 'smallint', nullable: true })
  riskScore!: number | null;

  /** Set by the database (`now()`), returned by the insert. */
  @CreateDateColumn({ type: 'timestamptz' })
  created!: Date;
}

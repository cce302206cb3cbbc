import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { printFigures } from './support/figures.js';
import { Fleet, type SampleProcess } from './support/sample-process.js';
import { ScenarioDatabase } from './support/scenario-database.js';
import { runStorm } from './support/storm.js';

/**
 * Scenario 1: several real sample-app processes (Express and Fastify) on one
 * database, all receiving the same request at once. Only the database can
 * arbitrate between processes, so this is the claim statement under real
 * contention, counted in `charges` rows.
 */
describe('storm across processes', () => {
  const fleet = new Fleet();
  let db: ScenarioDatabase;
  let instances: SampleProcess[];

  beforeAll(async () => {
    db = await ScenarioDatabase.create('storm');
    instances = await fleet.startMany(4, { name: 'storm', databaseUrl: db.url });
  });
  afterAll(async () => {
    await fleet.stopAll();
    await db?.drop();
  });

  it('200 concurrent identical POST /charges over 4 processes: one charge; every other answer a 409 with Retry-After or a byte-identical replay', () =>
    fleet.explain(async () => {
      const figures = await runStorm('processes', instances, db);
      printFigures('storm', { ...figures });
      expect(figures.charges).toBe(1);
      expect(figures.duplicateCharges).toBe(0);
      expect(instances.every((instance) => instance.alive)).toBe(true);
    }));

  it('25 keys × 8 concurrent copies over 4 processes: exactly one charge per key, none lost, none doubled', () =>
    fleet.explain(async () => {
      const figures = await runStorm('many-keys', instances, db, { keys: 25, copies: 8 });
      printFigures('storm/many-keys', { ...figures });
      expect(figures.charges).toBe(25);
      expect(figures.duplicateCharges).toBe(0);
    }));
});

// The worker dies while it commits a single-shard transaction (a deferred trigger on the shard sleeps inside
// its COMMIT, and the worker is stopped meanwhile): what the coordinator answers the app's COMMIT, and
// whether the writes committed. The contract says: a COMMIT whose answer never arrived is 503, never a success.
import { execSync } from 'node:child_process';
import pg from 'pg';
import { connect, send } from './request-path.mjs';

const dir = process.env.CITUS_DIR ?? '/tmp/citus-cluster';
const pgctl = (args) => execSync(`su postgres -c "/usr/lib/postgresql/15/bin/pg_ctl -D ${dir}/w2 ${args}"`, { stdio: 'pipe' }).toString().trim();
const worker = new pg.Client('postgres://postgres@127.0.0.1:9702/postgres');
await worker.connect();
await worker.query('SET citus.enable_ddl_propagation = off'); // a local trigger on the shard, for this test only
// The shard of tenant-b's charges, on 9702.
const coord = await connect('app');
const [shard] = await send(coord, 'the shard of tenant-b', [{ text: `SELECT shard_name('charges'::regclass, get_shard_id_for_distribution_column('charges', 'tenant-b')) AS shard` }]);
const shardName = shard.rows[0].shard;
await worker.query(`CREATE OR REPLACE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.amount = 4242 THEN PERFORM pg_sleep(3); END IF; RETURN NULL; END $$`);
await worker.query(`DROP TRIGGER IF EXISTS slow_commit ON ${shardName}`);
await worker.query(`CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON ${shardName} DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()`);
await worker.end();
const marker = `lost-${Date.now()}`;
await send(coord, 'BEGIN, insert (amount 4242: its deferred trigger sleeps 3 s inside COMMIT)', [{ text: 'START TRANSACTION' },
  { text: 'INSERT INTO charges (tenant_id, amount) VALUES ($1, 4242)', values: ['tenant-b'] }]);
const commit = send(coord, 'COMMIT (the worker is stopped 1 s into it)', [{ text: 'COMMIT' }]);
await new Promise((resolve) => setTimeout(resolve, 1000));
console.log(`   (worker 9702 stopped: ${pgctl('-m immediate stop').split('\n').pop()})`);
const [answer] = await commit;
console.log(`   the app's COMMIT answered: ${answer.ok ? 'OK (success)' : `${answer.error.code} ${answer.error.message}`}`);
console.log(`   (worker 9702 started: ${pgctl(`-l ${dir}/w2.log -w start`).split('\n').pop()})`);
await send(coord, 'did the insert commit?', [{ text: 'SELECT count(*) AS committed FROM charges WHERE tenant_id = $1 AND amount = 4242', values: ['tenant-b'] }]);
await send(coord, 'clean up', [{ text: 'DELETE FROM charges WHERE tenant_id = $1 AND amount = 4242', values: ['tenant-b'] }]);
const w2 = new pg.Client('postgres://postgres@127.0.0.1:9702/postgres');
await w2.connect(); await w2.query('SET citus.enable_ddl_propagation = off'); await w2.query(`DROP TRIGGER IF EXISTS slow_commit ON ${shardName}`); await w2.end();
await coord.end();
void marker;
